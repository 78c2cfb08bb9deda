"""The built-in harnesses, the real programs, run in the local sandbox against a scripted upstream speaking each one's
API (rllm_testing.harness_scripts): each runs a shell command, edits a file and finishes; the task's verifier scores
the episode; every model call is captured, in order, as a trainable Step; the sandbox reaches its own session and
nothing else. The programs are installed the way `rllm harness install` does (npm / pip, into $RLLM_HOME) when
missing, so a fresh CI machine runs them for real.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_search import search_mcp_over_http, write_corpus

import rllm
from rllm_core.errors import ConfigError
from rllm_core.harness import (
    HarnessEndpoint,
    HarnessInstall,
    HarnessLaunch,
    McpHttpServer,
    McpServer,
    get_harness,
    get_harnesses,
)
from rllm_envs.harbor.benchmark import HarborBenchmark
from rllm_harnesses.relay import EGRESS_PORT, HarnessRelay
from rllm_harnesses.rollout import harness_rollout, run_harness
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_testing.fake_upstream import start_fake_upstream
from rllm_testing.harness_scripts import SCRIPTS, scripted_responder

TASKS = Path(__file__).parent / "data" / "harness_tasks"
API = {"claude-code": "messages", "codex": "responses", "qwen-code": "chat", "mini-swe-agent": "chat"}

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap "
                                "(.ci/run installs it)")


def _installed(name: str) -> HarnessInstall:
    harness = get_harness(name)
    return harness.installed() or harness.install()


def _episode(rollout: Any, responder: Any) -> tuple[Any, Any]:
    with start_fake_upstream(responder) as up:
        bench = HarborBenchmark(TASKS)
        [task] = bench.load("test")
        episode = bench.wrap_rollout(rollout, sandbox="local").run(task, base_url=up.base_url, model="policy")
        return episode, up


@pytest.mark.parametrize("name", sorted(API))
def test_a_real_harness_runs_a_command_edits_a_file_and_every_call_is_captured(name: str) -> None:
    install = _installed(name)
    episode, _ = _episode(harness_rollout(name, max_turns=8), scripted_responder(name))
    verdict, run = episode.artifacts["harbor"], episode.artifacts["harness"]
    assert verdict["reason"] == "correct" and verdict["reward"] == 1.0, (verdict, run["output_tail"])
    assert run["version"] == install.version and run["exit_code"] == 0 and run["errors"] == []
    script = SCRIPTS[name]
    steps = episode.steps
    assert len(steps) == run["calls"] == len(script)  # every call the program made, none lost, none extra
    called = [[t["function"]["name"] for t in s.tool_calls or []] for s in steps]
    assert called == [[step[0]] if isinstance(step, tuple) else [] for step in script]  # in order
    for step in steps:
        assert step.error is None and step.trainable and step.token_source == "server"
        assert step.endpoint == API[name] and step.agent == name
    assert all(e.startswith(("CONNECT ", "GET ", "POST ")) for e in run["blocked_egress"])  # refused, recorded


class _Probe:
    """A test harness: a Python script run in the sandbox that makes one model call through the relay, then tries
    every other way out it can think of, and prints what happened as JSON."""

    name, api, install_command = "probe", "chat", "(built in the test)"

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home, self.env = home, env or {}

    def installed(self) -> HarnessInstall:
        return HarnessInstall(self.home, "0")

    def install(self) -> HarnessInstall:
        return self.installed()

    def launch(self, instruction: str, endpoint: HarnessEndpoint, install: HarnessInstall, *,
               max_turns: int) -> HarnessLaunch:
        return HarnessLaunch(f"/usr/bin/python3 {install.mount}/probe.py", {"BASE": endpoint.base_url, **self.env})


PROBE = """
import json, os, socket, urllib.request, urllib.error
base, out = os.environ["BASE"], {}
def post(path, body=None, method="POST"):
    req = urllib.request.Request(path, data=json.dumps(body or {}).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
out["llm"] = post(base + "/chat/completions", {"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
root = base[: -len("/v1")]
out["admin_stats"] = post(root + "/stats", method="GET")
out["dotdot"] = post(base + "/../../stats", method="GET")
out["other_session"] = post(base + "/../../sessions/other/steps", method="GET")
out["take"] = post(root + "/v1/../take")
def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
out["gateway_port"] = connect("127.0.0.1", int(os.environ["GATEWAY_PORT"]))
out["internet"] = connect("93.184.215.14", 443)
try:
    s = socket.create_connection(("127.0.0.1", PROXY_PORT), timeout=3)
    s.sendall(b"CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com:443\\r\\n\\r\\n")
    out["proxy"] = s.recv(100).split(b"\\r\\n")[0].decode()
except OSError as e:
    out["proxy"] = type(e).__name__
print("PROBE " + json.dumps(out))
"""


@pytest.fixture
def bindable() -> Any:
    """A host folder the sandbox's uid can reach (pytest's tmp_path is private to root)."""
    home = Path(tempfile.mkdtemp(prefix="rllm-test-harness-"))
    home.chmod(0o755)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_the_sandbox_reaches_its_own_session_and_nothing_else(bindable: Path) -> None:
    home = bindable
    (home / "probe.py").write_text(PROBE.replace("PROXY_PORT", str(EGRESS_PORT)))
    (home / "probe.py").chmod(0o644)
    with start_fake_upstream() as up, start_gateway([UpstreamConfig(url=up.base_url)], api_key="gw-token") as gw:
        probe = _Probe(home, {"GATEWAY_PORT": gw.url.rsplit(":", 1)[1]})

        @rllm.rollout
        async def agent(task: rllm.Task, config: rllm.RolloutConfig) -> dict[str, Any]:
            return await run_harness(probe, task, config)

        bench = HarborBenchmark(TASKS)
        [task] = bench.load("test")
        episode = bench.wrap_rollout(agent, sandbox="local").run(task, base_url=up.base_url, model="policy")
    assert episode.error is None, episode.error
    run = episode.artifacts["harness"]
    [line] = [ln for ln in run["output_tail"].splitlines() if ln.startswith("PROBE ")]
    seen = json.loads(line.removeprefix("PROBE "))
    assert seen["llm"] == 200 and len(episode.steps) == 1  # its own session: served and recorded
    assert seen["admin_stats"] == 404 and seen["dotdot"] == 404 and seen["other_session"] == 404
    assert seen["take"] == 404  # no admin route, no other session, through the relay
    assert seen["gateway_port"] != "connected" and seen["internet"] != "connected"  # no network at all
    assert seen["proxy"].startswith("HTTP/1.1 403") and run["blocked_egress"] == ["CONNECT example.com:443"]


def test_a_missing_harness_says_how_to_install_it_and_one_that_exits_at_once_is_a_harness_error(
        bindable: Path) -> None:
    class Missing(_Probe):
        def installed(self) -> None:  # type: ignore[override]
            return None

    class Broken(_Probe):
        def launch(self, *args: Any, **kwargs: Any) -> HarnessLaunch:
            return HarnessLaunch("echo 'fatal: no config for model' >&2; exit 3")

    for harness, needle in ((Missing(bindable), "install"), (Broken(bindable), "fatal: no config")):
        @rllm.rollout
        async def agent(task: rllm.Task, config: rllm.RolloutConfig, harness: Any = harness) -> Any:
            return await run_harness(harness, task, config)

        episode, _ = _episode(agent, "unused")
        verdict = episode.artifacts["harbor"]
        assert verdict["reason"] == "harness_error" and needle in verdict["note"], verdict
        assert episode.steps == []


def test_the_relay_names_side_calls_caps_the_budget_and_refuses_past_the_turn_limit() -> None:
    with start_fake_upstream() as up, start_gateway([UpstreamConfig(url=up.base_url)]) as gw:
        relay = HarnessRelay(gw.session_base_url("r"), agent="claude-code", side_model="rllm-side", max_turns=2,
                             max_tokens=16)
        with relay, httpx.Client(transport=httpx.HTTPTransport(uds=str(relay.dir / "llm.sock")),
                                 base_url="http://sandbox") as client:
            body = {"model": "policy", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]}
            statuses = [client.post("/v1/messages", json=body).status_code for _ in range(2)]
            side = client.post("/v1/messages", json={**body, "model": "rllm-side"})
            refused = client.post("/v1/messages", json=body)
            relay.max_turns += 1
            unset = client.post("/v1/chat/completions", json={"model": "policy", "messages": body["messages"]})
            assert client.get("/stats").status_code == 404
        assert statuses == [200, 200] and side.status_code == 200
        assert refused.status_code == 400 and "turn budget" in refused.json()["error"]["message"]
        steps = gw.take_steps("r")
    assert unset.status_code == 200
    assert [s.agent for s in steps] == ["claude-code", "claude-code", "claude-code.side", "claude-code"]
    assert all(s.params["max_tokens"] == 16 for s in steps) and up.requests[0]["max_tokens"] == 16  # capped, set
    assert relay.summary()["refused_calls"] == 1 and relay.summary()["side_calls"] == 1


def test_the_built_in_harnesses_are_registered_with_pinned_versions_and_install_commands() -> None:
    specs = get_harnesses()
    assert set(API) <= set(specs)
    for name in API:
        harness = get_harness(name)
        assert harness.api == API[name] and name in harness.install_command
    with pytest.raises(ConfigError, match="unknown harness 'nope'"):
        get_harness("nope")


def test_a_harness_run_outside_a_bindable_sandbox_is_refused_by_name(tmp_path: Path) -> None:
    from rllm_core.sandbox import EnvironmentSpec, sandbox_scope
    from rllm_testing.sandbox_double import SubprocessSandbox

    sandbox = SubprocessSandbox(EnvironmentSpec(name="t"), tmp_path / "sb")
    task = rllm.Task(id="t", instruction="x")
    config = rllm.RolloutConfig(base_url="http://127.0.0.1:9/v1", model="m", session_id="s")
    with sandbox_scope(sandbox), pytest.raises(ConfigError, match="--sandbox local"):
        asyncio.run(run_harness(_Probe(tmp_path), task, config))


# ------------------------------------------------------------------------------------------------ MCP servers
MCP_TASKS = Path(__file__).parent / "data" / "harness_mcp_tasks"
NOTES = {"notes": McpServer("/usr/bin/python3", ("/app/notes_server.py",))}
SHELL = {"claude-code": ("Bash", "command"), "qwen-code": ("run_shell_command", "command")}


def _tool_then_shell(name: str, pick: Any, arguments: dict[str, Any], pattern: str, path: str) -> Any:
    """A scripted policy: call the MCP tool `pick(tool specs)` names (each program names MCP tools its own way)
    with `arguments`, write what `pattern` finds in its answer to `path` with the program's shell tool, finish."""
    shell, arg = SHELL[name]

    def respond(body: dict[str, Any]) -> Any:
        if body.get("model") == "rllm-side":
            return "MCP task"
        done = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
        if done == 0:
            specs = [t.get("function", t) for t in body.get("tools") or []]
            tool = pick(specs)
            return {"tool_call": {"name": tool, "arguments": arguments}} if tool else \
                f"no such tool among {[t.get('name') for t in specs]}"
        if done == 1:
            found = re.search(pattern, json.dumps(body.get("messages")))
            value = found.group(1) if found else "MISSING"
            return {"tool_call": {"name": shell, "arguments": {arg: f"echo '{value}' > {path}",
                                                                "description": "Write the answer"}}}
        return f"Done: the answer is in {path}."

    return respond


def _mcp_responder(name: str) -> Any:
    """The notes server's code_word, written to /app/word.txt."""
    return _tool_then_shell(name, lambda specs: next((t["name"] for t in specs if t["name"].endswith("code_word")),
                                                     None), {}, r"WORD:([\w-]+)", "/app/word.txt")


@pytest.mark.parametrize("name", ["claude-code", "qwen-code"])
def test_the_agents_own_mcp_server_runs_in_its_sandbox(name: str) -> None:
    """A stdio MCP server of the agent's own (tests/data/harness_mcp_tasks: a dependency-free one in the task's
    /app) is started by the real program inside the sandbox; its answer reaches the model, and the verifier sees
    both the file the agent wrote and the server's own log in /app."""
    _installed(name)
    with start_fake_upstream(_mcp_responder(name)) as up:
        bench = HarborBenchmark(MCP_TASKS)
        [task] = bench.load("test")
        episode = bench.wrap_rollout(harness_rollout(name, max_turns=6, mcp_servers=NOTES), sandbox="local").run(
            task, base_url=up.base_url, model="policy")
    verdict, run = episode.artifacts["harbor"], episode.artifacts["harness"]
    assert verdict["reason"] == "correct" and verdict["reward"] == 1.0, (verdict, run["output_tail"])
    called = [t["function"]["name"] for s in episode.steps for t in s.tool_calls or []]
    assert called[0].endswith("code_word") and len(episode.steps) == 3


MCP_HTTP_TASKS = Path(__file__).parent / "data" / "harness_mcp_http_tasks"


def _search_responder(name: str) -> Any:
    """The environment's `search` tool (found by its description), the top hit's title to /app/answer.txt."""
    def pick(specs: list[dict[str, Any]]) -> str | None:
        return next((t["name"] for t in specs if str(t.get("description", "")).startswith("Search the passages")),
                    None)

    return _tool_then_shell(name, pick, {"query": "Kiss and Tell Corliss Archer", "k": 2}, r"\[d\d+\] ([^:\\]+):",
                            "/app/answer.txt")


@pytest.mark.parametrize("name", ["claude-code", "qwen-code"])
def test_an_environments_mcp_tools_on_the_host_reach_the_agent_in_its_sandbox(name: str, tmp_path: Path) -> None:
    """`rllm retrieve mcp --transport http` runs on the host; the sandbox has no network, so the relay carries the
    program's MCP requests to that server (and no other): the search result reaches the model, the verifier checks
    the title the agent wrote, and the call is on the episode's tool_log as the server's own log has it."""
    _installed(name)
    corpus, log = write_corpus(tmp_path / "corpus.jsonl"), tmp_path / "server_tools.jsonl"
    with search_mcp_over_http(corpus, tmp_path / "home", log) as url, \
            start_fake_upstream(_search_responder(name)) as up:
        bench = HarborBenchmark(MCP_HTTP_TASKS)
        [task] = bench.load("test")
        agent = harness_rollout(name, max_turns=6, mcp_servers={"search": McpHttpServer(url)})
        episode = bench.wrap_rollout(agent, sandbox="local").run(task, base_url=up.base_url, model="policy")
    verdict, run = episode.artifacts["harbor"], episode.artifacts["harness"]
    assert verdict["reason"] == "correct" and verdict["reward"] == 1.0, (verdict, run["output_tail"])
    [record] = episode.artifacts["tool_log"]
    assert (record["name"], record["transport"], record["error"]) == ("search", "mcp", None)
    assert record["arguments"] == {"query": "Kiss and Tell Corliss Archer", "k": 2} and record["result_chars"] > 50
    [served] = [json.loads(line) for line in log.read_text().splitlines()]
    assert served["result_chars"] == record["result_chars"]  # what the server returned is what the relay saw


@pytest.mark.parametrize("name", ["codex", "mini-swe-agent"])
def test_a_harness_without_mcp_wiring_refuses_mcp_servers_by_name(name: str) -> None:
    with pytest.raises(ConfigError, match=f"'{name}' does not speak MCP here"):
        harness_rollout(name, mcp_servers=NOTES)
