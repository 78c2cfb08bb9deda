"""A harness as an episode's agent: `harness_rollout("claude-code")` is an `@rllm.rollout` that runs the program,
unchanged, in the episode's sandbox (`current_sandbox()`, which a Harbor task set such as `terminal` provides).

The program's folder is bound read-only into the sandbox, its config files are written, the relay (relay.py) is
started, and one command runs it on the task's instruction with the time budget left and `max_turns` model
calls. Its output tail, exit code, call counts and any blocked egress are returned (they land in the episode's
artifacts); the gateway has recorded every model call as the episode's Steps. A program that exits at once
(non-zero, no model call) raises HarnessError: the episode is scored `harness_error` with that tail.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Mapping
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.harness import Harness, HarnessEndpoint, HarnessError, McpHttpServer, McpServer, get_harness
from rllm_core.sandbox import current_sandbox
from rllm_core.types import Task
from rllm_harnesses.mcp_route import MCP_PORT, McpRoute
from rllm_harnesses.relay import INSIDE_DIR, LLM_PORT, HarnessRelay
from rllm_rollout.rollout import Rollout, RolloutConfig, rollout

__all__ = ["DEFAULT_MAX_TURNS", "SIDE_MODEL", "harness_rollout", "run_harness"]

DEFAULT_MAX_TURNS = 20
SIDE_MODEL = "rllm-side"
"""The model name a harness is given for side calls; the relay records those under `<harness>.side`."""
_TAIL = 4000
_DEFAULT_TIMEOUT_S = 900.0


def _script(relay: HarnessRelay, files: dict[str, str], command: str) -> str:
    lines = [relay.inside_command()]
    for path, text in files.items():
        marker = "RLLM_HARNESS_EOF"
        lines.append(f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')} && cat > {shlex.quote(path)} "
                     f"<<'{marker}'\n{text}\n{marker}\n")
    lines.append(f"{command} </dev/null\n")
    return "".join(lines)


AnyMcpServer = McpServer | McpHttpServer


def _check_mcp(harness: Harness, servers: Mapping[str, AnyMcpServer]) -> None:
    if servers and getattr(harness, "with_mcp", None) is None:
        raise ConfigError(f"harness {harness.name!r} does not speak MCP here, so it cannot be given the MCP servers "
                          f"{sorted(servers)}; claude-code and qwen-code can")


def _with_mcp(harness: Harness, launch: Any, servers: Mapping[str, AnyMcpServer]) -> tuple[Any, McpRoute | None]:
    """The launch configured for `servers`, and the relay's route to the host (HTTP) ones: the program is told
    each is on its own loopback (`127.0.0.1:MCP_PORT/<name>`), the route carries it to the host URL."""
    _check_mcp(harness, servers)
    if not servers:
        return launch, None
    remote = {n: s for n, s in servers.items() if isinstance(s, McpHttpServer)}
    route = McpRoute({n: s.url for n, s in remote.items()}, {n: s.headers for n, s in remote.items()}) \
        if remote else None
    inside = {n: McpHttpServer(f"http://127.0.0.1:{MCP_PORT}/{n}") if n in remote else s for n, s in servers.items()}
    return harness.with_mcp(launch, inside), route  # type: ignore[attr-defined]


async def run_harness(harness: Harness, task: Task, config: RolloutConfig, *, max_turns: int = DEFAULT_MAX_TURNS,
                      timeout_s: float | None = None, mcp_servers: Mapping[str, AnyMcpServer] | None = None
                      ) -> dict[str, Any]:
    """Run `harness` on `task` in the current sandbox (module docstring); the result for the episode. With
    `mcp_servers` (name -> server), the program is configured to use them: a stdio `McpServer` it starts itself, in
    the sandbox beside it; a host `McpHttpServer` through the relay, its tool calls on the episode's `tool_log`."""
    sandbox = current_sandbox()
    install = harness.installed()
    if install is None:
        raise HarnessError(f"harness {harness.name!r} is not installed; install it with: {harness.install_command}")
    mount_ro = getattr(sandbox, "mount_ro", None)
    if mount_ro is None:
        raise ConfigError(f"harness {harness.name!r} needs a sandbox that can bind its program read-only "
                          "(the local sandbox, `--sandbox local`); the others are not supported yet")
    budget = timeout_s if timeout_s is not None else float(task.metadata.get("agent_timeout_s") or _DEFAULT_TIMEOUT_S)
    endpoint = HarnessEndpoint(base_url=f"http://127.0.0.1:{LLM_PORT}/v1", model=config.model, side_model=SIDE_MODEL)
    max_turns = int(task.metadata.get("max_turns") or max_turns)  # `rllm eval --max-turns` sets it on the task
    launch, route = _with_mcp(harness, harness.launch(task.instruction, endpoint, install, max_turns=max_turns),
                              mcp_servers or {})
    cap = config.sampling.get("max_tokens")
    with HarnessRelay(config.base_url, agent=harness.name, side_model=SIDE_MODEL, max_turns=max_turns,
                      max_tokens=int(cap) if isinstance(cap, int) else None, mcp=route) as relay:
        mount_ro(install.home, install.mount)
        mount_ro(relay.dir, INSIDE_DIR)
        sandbox.address_space_mb = getattr(harness, "address_space_mb", None)  # type: ignore[attr-defined]
        started = time.monotonic()
        try:
            result = await asyncio.to_thread(sandbox.exec, _script(relay, dict(launch.files), launch.command),
                                             timeout_s=budget, env=dict(launch.env))
        finally:  # the verifier runs without the harness's program or the relay's sockets
            sandbox.unmount(install.mount)  # type: ignore[attr-defined]
            sandbox.unmount(INSIDE_DIR)  # type: ignore[attr-defined]
            sandbox.address_space_mb = None  # type: ignore[attr-defined]
        seconds = time.monotonic() - started
        summary = relay.summary()
    out = {"harness": harness.name, "version": install.version, "exit_code": result.exit_code,
           "timed_out": result.timed_out, "seconds": round(seconds, 2), "output_tail": result.output[-_TAIL:],
           **summary}
    if result.exit_code != 0 and not result.timed_out and summary["calls"] == 0:
        raise HarnessError(f"harness {harness.name} exited {result.exit_code} without calling the model; its "
                           f"output ends: {result.output[-600:].strip() or '(nothing)'}", result.output[-_TAIL:])
    return {"answer": "", "harness": out, **({"tool_log": list(route.records)} if route is not None else {})}


def harness_rollout(name: str, *, max_turns: int = DEFAULT_MAX_TURNS, timeout_s: float | None = None,
                    mcp_servers: Mapping[str, AnyMcpServer] | None = None) -> Rollout:
    """The rollout (named `name`) that runs harness `name`; it is checked to exist now, installed at run time.
    `mcp_servers`: name -> the agent's own stdio `McpServer` (started by the program in the sandbox) or a host
    `McpHttpServer` (an environment's tools, reached through the relay)."""
    harness = get_harness(name)
    servers = dict(mcp_servers or {})
    _check_mcp(harness, servers)  # refused now, by name, not at the first episode

    async def run(task: Task, config: RolloutConfig) -> dict[str, Any]:
        return await run_harness(harness, task, config, max_turns=max_turns, timeout_s=timeout_s,
                                 mcp_servers=servers)

    run.__name__ = run.__qualname__ = name.replace("-", "_")
    return rollout(name=name)(run)
