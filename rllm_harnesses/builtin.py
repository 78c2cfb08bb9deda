"""The built-in harnesses: four CLI coding agents, each pinned, installed the way its users install it, and started
non-interactively with its model endpoint pointed at the episode's session (its own environment variables or
config file), its telemetry and update checks off, its own permission prompts and sandbox off (the episode's
sandbox is the boundary), and its own turn limit where it has one (the relay enforces the budget regardless).

| name           | package                       | how        | API it speaks          |
|----------------|-------------------------------|------------|------------------------|
| claude-code    | @anthropic-ai/claude-code     | npm        | Anthropic Messages     |
| codex          | @openai/codex                 | npm        | OpenAI Responses       |
| qwen-code      | @qwen-code/qwen-code          | npm        | OpenAI Chat            |
| mini-swe-agent | mini-swe-agent                | pip        | OpenAI Chat, text mode |
"""

from __future__ import annotations

import json
import shlex
import subprocess
from typing import ClassVar

from rllm_core.harness import HarnessApi, HarnessEndpoint, HarnessInstall, HarnessLaunch, McpHttpServer, McpServer
from rllm_harnesses.install import installed_copy, npm_install, pip_install
from rllm_harnesses.relay import EGRESS_PORT

__all__ = ["BUILTIN", "ClaudeCode", "Codex", "MiniSweAgent", "QwenCode"]

_PROXY = f"http://127.0.0.1:{EGRESS_PORT}"
_COMMON_ENV = {"HTTP_PROXY": _PROXY, "HTTPS_PROXY": _PROXY, "http_proxy": _PROXY, "https_proxy": _PROXY,
               "ALL_PROXY": _PROXY, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
               "CI": "1", "NO_COLOR": "1", "TERM": "dumb"}
"""Every harness: anything but the loopback endpoint goes to the refusing proxy (so attempts are recorded)."""
SANDBOX_PYTHON = "/usr/bin/python3"
MCP_CONFIG = "/tmp/rllm-mcp.json"


def _claude_mcp(server: McpServer | McpHttpServer) -> dict[str, object]:
    if isinstance(server, McpHttpServer):
        return {"type": "http", "url": server.url, "headers": dict(server.headers)}
    return {"type": "stdio", "command": server.command, "args": list(server.args), "env": dict(server.env)}


def _qwen_mcp(server: McpServer | McpHttpServer) -> dict[str, object]:
    if isinstance(server, McpHttpServer):  # Gemini CLI's streamable-HTTP key (`url` would be the older SSE one)
        return {"httpUrl": server.url, "headers": dict(server.headers), "trust": True}
    return {"command": server.command, "args": list(server.args), "env": dict(server.env), "trust": True}


class _PinnedHarness:
    """A pinned package installed the way its users do: `registry_command` says how (shown when it is missing)."""

    name: ClassVar[str]
    api: ClassVar[HarnessApi]
    package: ClassVar[str]
    version: ClassVar[str]
    registry_command: ClassVar[str]

    @property
    def install_command(self) -> str:
        return f"rllm harness install {self.name}   # {self.registry_command.format(p=self.package, v=self.version)}"

    def installed(self) -> HarnessInstall | None:
        return installed_copy(self.name, self.version)


class _NpmHarness(_PinnedHarness):
    bin: ClassVar[str]
    registry_command = "npm install {p}@{v}"

    def install(self) -> HarnessInstall:
        return npm_install(self.name, self.package, self.version)

    def program(self, install: HarnessInstall) -> str:
        return f"{install.mount}/node_modules/.bin/{self.bin}"


class ClaudeCode(_NpmHarness):
    """Claude Code in print mode (`claude -p`): Anthropic Messages, streamed, with its Bash / Edit / Write tools."""

    name, api, package, version, bin = "claude-code", "messages", "@anthropic-ai/claude-code", "2.1.332", "claude"

    def launch(self, instruction: str, endpoint: HarnessEndpoint, install: HarnessInstall, *,
               max_turns: int) -> HarnessLaunch:
        env = {**_COMMON_ENV, "ANTHROPIC_BASE_URL": endpoint.root_url, "ANTHROPIC_API_KEY": endpoint.api_key,
               "ANTHROPIC_MODEL": endpoint.model, "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.model,
               "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.side_model,
               "ANTHROPIC_SMALL_FAST_MODEL": endpoint.side_model, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
               "IS_SANDBOX": "1", "CLAUDE_CODE_USE_BEDROCK": "0", "USE_BUILTIN_RIPGREP": "1"}
        command = (f"{self.program(install)} -p {shlex.quote(instruction)} --dangerously-skip-permissions "
                   f"--max-turns {int(max_turns)} --model {shlex.quote(endpoint.model)}")
        return HarnessLaunch(command, env)

    def with_mcp(self, launch: HarnessLaunch, servers: dict[str, McpServer | McpHttpServer]) -> HarnessLaunch:
        """`--mcp-config FILE --strict-mcp-config`: these servers and no others (its tools: mcp__NAME__TOOL), offered
        in the request's tools rather than behind its ToolSearch (ENABLE_TOOL_SEARCH=false): a policy being trained
        sees the tools it can call."""
        config = json.dumps({"mcpServers": {n: _claude_mcp(s) for n, s in servers.items()}})
        return HarnessLaunch(f"{launch.command} --mcp-config {MCP_CONFIG} --strict-mcp-config",
                             {**launch.env, "ENABLE_TOOL_SEARCH": "false"}, {**launch.files, MCP_CONFIG: config})


class Codex(_NpmHarness):
    """Codex CLI (`codex exec`): the OpenAI Responses API through a provider in ~/.codex/config.toml."""

    name, api, package, version, bin = "codex", "responses", "@openai/codex", "0.171.0", "codex"

    def launch(self, instruction: str, endpoint: HarnessEndpoint, install: HarnessInstall, *,
               max_turns: int) -> HarnessLaunch:
        config = "\n".join([
            f"model = {json.dumps(endpoint.model)}", 'model_provider = "rllm"', "check_for_update_on_startup = false",
            "[model_providers.rllm]", 'name = "rllm"', f"base_url = {json.dumps(endpoint.base_url)}",
            'env_key = "RLLM_API_KEY"', 'wire_api = "responses"', "request_max_retries = 0",
            "stream_max_retries = 0", "[analytics]", "enabled = false", ""])
        env = {**_COMMON_ENV, "RLLM_API_KEY": endpoint.api_key, "CODEX_HOME": "/root/.codex"}
        command = (f"{self.program(install)} exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "
                   f"--color never {shlex.quote(instruction)}")
        return HarnessLaunch(command, env, {"/root/.codex/config.toml": config})



class QwenCode(_NpmHarness):
    """Qwen Code (`qwen -p`, a Gemini CLI fork): OpenAI Chat Completions through OPENAI_BASE_URL."""

    name, api, package, version, bin = "qwen-code", "chat", "@qwen-code/qwen-code", "0.24.4", "qwen"
    address_space_mb = 65536
    """Node's fetch instantiates WebAssembly, which reserves ~10 GB of address space (never touched): under the
    task's memory_mb as an address-space limit it fails with 'Out of memory'."""

    def install(self) -> HarnessInstall:
        install = super().install()
        for rg in install.home.glob("node_modules/@qwen-code/qwen-code/vendor/ripgrep/*/rg"):
            rg.chmod(0o755)  # shipped without its exec bit; qwen sets it on first run, which a read-only bind forbids
        return install

    def launch(self, instruction: str, endpoint: HarnessEndpoint, install: HarnessInstall, *,
               max_turns: int) -> HarnessLaunch:
        env = {**_COMMON_ENV, "OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": endpoint.api_key,
               "OPENAI_MODEL": endpoint.model}
        settings = json.dumps({  # its background memory / skill reviews would be side calls with the policy's model
            "security": {"auth": {"selectedType": "openai"}}, "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False}, "model": {"maxSessionTurns": int(max_turns)},
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False}})
        command = f"{self.program(install)} -p {shlex.quote(instruction)} --yolo"
        return HarnessLaunch(command, env, {"/root/.qwen/settings.json": settings})

    def with_mcp(self, launch: HarnessLaunch, servers: dict[str, McpServer | McpHttpServer]) -> HarnessLaunch:
        """`mcpServers` in its settings.json (trusted, so --yolo calls them), with its ToolSearch bridge off
        (`tools.toolSearch.enabled`): the servers' tools are declared in each request."""
        settings = json.loads(launch.files["/root/.qwen/settings.json"])
        settings["mcpServers"] = {n: _qwen_mcp(s) for n, s in servers.items()}
        settings["tools"] = {**settings.get("tools", {}), "toolSearch": {"enabled": False}}
        return HarnessLaunch(launch.command, launch.env,
                             {**launch.files, "/root/.qwen/settings.json": json.dumps(settings)})



class MiniSweAgent(_PinnedHarness):
    """mini-swe-agent (`mini -y --exit-immediately`): OpenAI Chat through litellm, text-based actions.

    Its text-based mode (mini_textbased.yaml: one fenced bash block per reply, no `tools` in the request) is the
    one any chat model can be trained in: small models' chat templates (SmolLM2's) have no tool support, and a
    server refuses `tools` for them."""

    name, api, package, version = "mini-swe-agent", "chat", "mini-swe-agent", "2.4.6"
    registry_command = "pip install {p}=={v}"

    def install(self) -> HarnessInstall:
        return pip_install(self.name, self.package, self.version, _sandbox_python_version())

    def launch(self, instruction: str, endpoint: HarnessEndpoint, install: HarnessInstall, *,
               max_turns: int) -> HarnessLaunch:
        env = {**_COMMON_ENV, "PYTHONPATH": f"{install.mount}/site", "OPENAI_API_KEY": endpoint.api_key,
               "MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
               "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONDONTWRITEBYTECODE": "1",
               "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2"}  # a failing call must not sleep out the episode
        specs = ["mini_textbased.yaml", f"model.model_kwargs.api_base={endpoint.base_url}",
                 f"agent.step_limit={max_turns}", "agent.cost_limit=0"]
        config = " ".join(f"-c {shlex.quote(s)}" for s in specs)
        command = (f"{SANDBOX_PYTHON} -m minisweagent.run.mini -y --exit-immediately --model-class litellm_textbased "
                   f"-m {shlex.quote('openai/' + endpoint.model)} {config} -o /tmp/mini.traj.json "
                   f"-t {shlex.quote(instruction)}")
        return HarnessLaunch(command, env)


def _sandbox_python_version() -> tuple[int, int]:
    out = subprocess.run([SANDBOX_PYTHON, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


BUILTIN = (ClaudeCode, Codex, QwenCode, MiniSweAgent)
