"""The built-in terminal agent (`rllm_envs.terminal.agent`).

(a) Against the scripted fake upstream, through the rllm gateway, in a sandbox double (plain subprocesses in a temp
dir): commands really run, one Step per model call, tool results as `role: tool` messages, the text format, output
truncation, max turns, the time budget, model errors, options, and exact rewards with H1's Harbor verifier.
(b) End to end against the real policy server (`tiny-random`, exact turns): see the test's docstring for what the
random model can and cannot exercise.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rllm_core.errors import ConfigError
from rllm_core.sandbox import EnvironmentSpec, ExecResult, sandbox_scope
from rllm_core.types import Episode, Task
from rllm_envs.terminal import agent as agent_mod
from rllm_envs.terminal.actions import format_observation, parse_bash_arguments, parse_text_action, truncate_middle
from rllm_envs.terminal.agent import (
    TerminalAgentOptions,
    make_terminal_agent,
    system_prompt,
    terminal_agent,
    time_budget,
)
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.sandbox_double import SubprocessSandbox, SubprocessSandboxProvider

SAMPLING = {"temperature": 0.3, "max_tokens": 512}


# ------------------------------------------------------------------------------------------------ helpers
def bash(command: str) -> dict[str, Any]:
    return {"tool_call": {"name": "bash", "arguments": {"command": command}}}


def scripted(replies: list[Any]) -> Callable[[dict[str, Any]], Any]:
    """Reply k to the k-th call of an episode (counted by the assistant messages already in the history); the
    last reply repeats."""
    def responder(body: dict[str, Any]) -> Any:
        k = sum(m.get("role") == "assistant" for m in body.get("messages") or [])
        return replies[min(k, len(replies) - 1)]
    return responder


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[SubprocessSandbox]:
    provider = SubprocessSandboxProvider(tmp_path)
    sb = provider.start(EnvironmentSpec(name="agent-test"))
    try:
        yield sb
    finally:
        provider.close_all()


@pytest.fixture(autouse=True)
def _fresh_tool_memory() -> Iterator[None]:
    agent_mod._NO_TOOLS.clear()
    yield
    agent_mod._NO_TOOLS.clear()


async def run(up: FakeUpstream, sb: Any, task: Task | None = None, agent: Any = terminal_agent,
              **options: Any) -> Episode:
    task = task or Task(id="t1", instruction="Make /app/out.txt say hello.")
    with sandbox_scope(sb):
        return await agent.arun(task, base_url=up.base_url, model="fake", sampling=SAMPLING,
                                terminal_agent=options or None)


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


# ------------------------------------------------------------------------------------------------ (a) tools
async def test_tool_calls_run_in_the_sandbox_one_step_per_call(sandbox: SubprocessSandbox) -> None:
    replies = [bash("echo hello > /app/out.txt && cat /app/out.txt"), bash("ls /app; exit 3"), "All done."]
    with start_fake_upstream(scripted(replies)) as up:
        ep = await run(up, sandbox)
    assert ep.error is None, ep.error
    assert (sandbox.host_path("/app/out.txt")).read_text() == "hello\n"
    assert len(up.requests) == 3 and len(ep.trajectories) == 1 and len(ep.steps) == 3
    assert ep.trajectories[0].name == "terminal"
    assert [s.finish_reason for s in ep.steps] == ["tool_calls", "tool_calls", "stop"]
    assert json.loads(ep.steps[0].tool_calls[0]["function"]["arguments"])["command"].startswith("echo hello")
    first, last = up.requests[0], up.requests[-1]
    assert [t["function"]["name"] for t in first["tools"]] == ["bash"]
    assert first["temperature"] == 0.3 and first["max_tokens"] == 512
    assert first["messages"][0]["role"] == "system" and "/app" in first["messages"][0]["content"]
    assert first["messages"][1] == {"role": "user", "content": "Make /app/out.txt say hello."}
    tools = tool_messages(last)
    assert [t["content"] for t in tools] == ["exit code: 0\nhello\n", "exit code: 3\nout.txt\n"]
    calls = [m for m in last["messages"] if m["role"] == "assistant"]
    assert [t["tool_call_id"] for t in tools] == [c["tool_calls"][0]["id"] for c in calls]
    art = ep.artifacts
    assert art["stop_reason"] == "done" and art["turns"] == 3 and art["action_format"] == "tools"
    assert art["answer"] == "All done."
    assert [(c["exit_code"], c["timed_out"]) for c in art["commands"]] == [(0, False), (3, False)]
    execs = [c for c in sandbox.calls if c.method == "exec"]
    assert len(execs) == 2 and all(0 < c.args["timeout_s"] <= 180 for c in execs)


async def test_bad_tool_calls_are_answered_and_counted_as_format_errors(sandbox: SubprocessSandbox) -> None:
    replies = [{"tool_call": {"name": "python", "arguments": {"code": "1"}}},
               {"tool_call": {"name": "bash", "arguments": {"cmd": "ls"}}},
               {"tool_call": {"name": "bash", "arguments": {"command": ""}}}]
    with start_fake_upstream(scripted(replies)) as up:
        ep = await run(up, sandbox)
    assert ep.artifacts["stop_reason"] == "format_errors" and len(ep.steps) == 3 and ep.artifacts["commands"] == []
    said = [t["content"] for t in tool_messages(up.requests[-1])]
    assert "there is no tool 'python'" in said[0] and "non-empty string argument `command`" in said[1]


async def test_max_turns(sandbox: SubprocessSandbox) -> None:
    with start_fake_upstream(scripted([bash("echo again >> /app/log.txt")])) as up:
        ep = await run(up, sandbox, max_turns=4)
    assert ep.artifacts["stop_reason"] == "max_turns" and len(ep.steps) == 4 and len(up.requests) == 4
    assert sandbox.host_path("/app/log.txt").read_text() == "again\n" * 4


async def test_time_budget_caps_commands_and_ends_the_episode(sandbox: SubprocessSandbox) -> None:
    with start_fake_upstream(scripted([bash("sleep 30")])) as up:
        started = time.monotonic()
        ep = await run(up, sandbox, time_budget_s=1.5, command_timeout_s=60)
        took = time.monotonic() - started
    assert ep.error is None, ep.error
    assert ep.artifacts["stop_reason"] == "time_budget" and ep.artifacts["time_budget_s"] == 1.5
    assert took < 10, took
    execs = [c for c in sandbox.calls if c.method == "exec"]
    assert execs and execs[0].args["timeout_s"] <= 1.5  # the command's timeout is what is left of the budget


def test_time_budget_comes_from_the_tasks_agent_timeout() -> None:
    opts = TerminalAgentOptions()
    assert time_budget(Task(id="a", instruction="x", metadata={"agent_timeout_s": 100}), opts) == 90.0
    assert time_budget(Task(id="b", instruction="x", metadata={"agent_timeout_sec": 1000}), opts) == 970.0
    assert time_budget(Task(id="c", instruction="x"), opts) == agent_mod.DEFAULT_TIME_BUDGET_S
    assert time_budget(Task(id="d", instruction="x", metadata={"agent_timeout_s": 100}),
                       TerminalAgentOptions(time_budget_s=5)) == 5


async def test_long_output_is_cut_to_head_and_tail(sandbox: SubprocessSandbox) -> None:
    with start_fake_upstream(scripted([bash("seq 1 5000"), "ok"])) as up:
        ep = await run(up, sandbox, max_observation_chars=1000)
    seen = tool_messages(up.requests[-1])[0]["content"]
    full = "".join(f"{i}\n" for i in range(1, 5001))
    assert seen.startswith("exit code: 0\n1\n2\n3\n") and seen.endswith("4999\n5000\n")
    assert f"[... {len(full) - 1000} characters cut from the middle of the output ...]" in seen
    assert len(seen) < 1000 + 100 and ep.artifacts["stop_reason"] == "done"


# ------------------------------------------------------------------------------------------------ (a) text format
async def test_text_format_runs_the_fenced_block_and_stops_at_done(sandbox: SubprocessSandbox) -> None:
    replies = ["Let me count.\n```bash\nprintf 'a\\nb\\n' > /app/f.txt; wc -l < /app/f.txt\n```",
               "Two lines, as asked. DONE"]
    with start_fake_upstream(scripted(replies)) as up:
        ep = await run(up, sandbox, action_format="text")
    assert ep.error is None and ep.artifacts["stop_reason"] == "done" and len(ep.steps) == 2
    assert "tools" not in up.requests[0] and "```bash" in up.requests[0]["messages"][0]["content"]
    assert up.requests[-1]["messages"][-1] == {"role": "user", "content": "exit code: 0\n2\n"}
    assert sandbox.host_path("/app/f.txt").read_text() == "a\nb\n"


async def test_text_format_errors_are_reprompted_then_end_the_episode(sandbox: SubprocessSandbox) -> None:
    with start_fake_upstream(scripted(["I am not sure what to do."])) as up:
        ep = await run(up, sandbox, action_format="text", max_format_errors=3)
    assert ep.artifacts["stop_reason"] == "format_errors" and len(ep.steps) == 3 and ep.artifacts["commands"] == []
    reprompts = [m["content"] for m in up.requests[-1]["messages"] if m["role"] == "user"][1:]
    assert len(reprompts) == 2 and all("No command found" in r for r in reprompts)


def test_text_action_parsing() -> None:
    assert parse_text_action("x\n```bash\nls -la\n```\n").command == "ls -la"
    assert parse_text_action("```sh\ncat a\n```").command == "cat a"
    assert parse_text_action("```\necho bare\n```").command == "echo bare"
    two = parse_text_action("```bash\nfirst\n```\nthen\n```bash\nsecond\n```")
    assert (two.kind, two.command, two.blocks) == ("command", "first", 2)
    assert parse_text_action("```bash\nls\n```\nDONE").kind == "command"  # a block wins over DONE
    assert parse_text_action("All finished: DONE.").kind == "done"
    assert parse_text_action("UNDONE work").kind == "none"
    assert parse_text_action("done").kind == "none"  # the word is DONE, uppercase
    assert parse_text_action("```python\nprint(1)\n```").kind == "none"  # not a shell block
    assert parse_text_action("```bash\n   \n```").kind == "none"


def test_observation_and_argument_helpers() -> None:
    assert truncate_middle("abcdefghij", 4) == "ab\n[... 6 characters cut from the middle of the output ...]\nij"
    assert truncate_middle("short", 100) == "short"
    assert format_observation(ExecResult(0, ""), 100) == "exit code: 0\n(no output)"
    timed = format_observation(ExecResult(124, "partial", timed_out=True, duration_s=5.2), 100)
    assert timed == "the command timed out after 5 s and was killed\nexit code: 124\npartial"
    assert "kept only the start and end" in format_observation(ExecResult(0, "x", truncated=True), 100)
    assert parse_bash_arguments("bash", '{"command": "ls"}') == ("ls", None)
    assert "not valid JSON" in (parse_bash_arguments("bash", "{oops")[1] or "")
    assert "/work" in system_prompt("tools", "/work") and "`bash` tool" in system_prompt("tools", "/app")
    assert "DONE" in system_prompt("text", "/app")


# ------------------------------------------------------------------------------------------------ (a) model errors
@pytest.fixture
def refusing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake upstream answers 400 to tools (like a chat template without them) and to long prompts."""
    async def chat(self: FakeUpstream, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("tools"):
            self.requests.append(body)
            return web.json_response({"error": {"message": "the chat template of 'fake' does not support tools",
                                                "type": "invalid_request_error"}}, status=400)
        if len(json.dumps(body["messages"])) > 1500:
            self.requests.append(body)
            return web.json_response({"error": {"message": "the prompt has 2000 tokens and max_tokens is 64: 2064 "
                                                "is over the model's context length of 2048",
                                                "type": "invalid_request_error"}}, status=400)
        return await self._serve(request, chat=True)

    monkeypatch.setattr(FakeUpstream, "_chat", chat)


@pytest.mark.usefixtures("refusing")
async def test_auto_falls_back_to_text_when_tools_are_refused(sandbox: SubprocessSandbox) -> None:
    replies = ["```bash\necho hi > /app/a.txt\n```", "DONE"]
    with start_fake_upstream(scripted(replies)) as up:
        ep = await run(up, sandbox)
        assert ep.error is None and ep.artifacts["action_format"] == "text" and ep.artifacts["stop_reason"] == "done"
        assert len(up.requests) == 3 and "tools" in up.requests[0] and "tools" not in up.requests[1]
        assert ep.steps[0].error is not None and ep.artifacts["turns"] == 2  # the refused call: not a turn
        assert "DONE" in up.requests[1]["messages"][0]["content"]  # the system prompt was switched
        again = await run(up, sandbox)  # the endpoint is remembered: no second refused call
        assert len(up.requests) == 5 and "tools" not in up.requests[3] and again.artifacts["stop_reason"] == "done"
    assert sandbox.host_path("/app/a.txt").read_text() == "hi\n"


@pytest.mark.usefixtures("refusing")
async def test_tools_only_and_context_exceeded_end_cleanly(sandbox: SubprocessSandbox) -> None:
    with start_fake_upstream(scripted(["```bash\nseq 1 2000\n```"])) as up:
        refused = await run(up, sandbox, action_format="tools")
        full = await run(up, sandbox, action_format="text", max_observation_chars=4000)
    assert refused.error is None and refused.artifacts["stop_reason"] == "model_error"
    assert "does not support tools" in refused.artifacts["error"] and refused.artifacts["turns"] == 0
    assert full.error is None and full.artifacts["stop_reason"] == "context_exceeded"
    assert "context length" in full.artifacts["error"] and full.artifacts["turns"] == 1
    assert full.artifacts["context_exceeded_at_turn"] == 2 and "context_exceeded_at_turn" not in refused.artifacts


def test_terminal_scores_an_undone_task_that_ran_out_of_context_as_context_exceeded() -> None:
    """The verifier's verdict stands when the task is done; otherwise a full context is the reason (its partial
    reward kept); infrastructure failures keep their own reason."""
    from rllm_envs.harbor.episode import HarborVerdict
    from rllm_envs.terminal.benchmark import TerminalBenchmark

    bench = TerminalBenchmark()
    task = bench.load(max_examples=1)[0]

    def scored(reason: str, reward: float, **art: Any) -> tuple[float, str]:
        verdict = HarborVerdict(task_id=task.id, reason=reason, reward=reward).model_dump(mode="json")  # type: ignore[arg-type]
        result = bench.score(task, Episode(task=task, termination_reason="completed",
                                           artifacts={"harbor": verdict, **art}))
        return result.reward, result.reason

    full = {"stop_reason": "context_exceeded", "context_exceeded_at_turn": 7}
    assert scored("wrong_answer", 0.5, **full) == (0.5, "context_exceeded")
    assert scored("correct", 1.0, **full) == (1.0, "correct")
    assert scored("sandbox_error", 0.0, **full) == (0.0, "sandbox_error")
    assert scored("wrong_answer", 0.0) == (0.0, "wrong_answer")


async def test_terminal_default_agent_turns_and_the_max_turns_override(sandbox: SubprocessSandbox) -> None:
    """`rllm eval/train terminal` run the agent with MAX_TURNS turns; `task.metadata["max_turns"]` (what
    `rllm eval --max-turns` sets) overrides it, and a run's `terminal_agent` option overrides that."""
    from rllm_envs.terminal.benchmark import MAX_TURNS, TURN_TOKENS, TerminalBenchmark

    bench = TerminalBenchmark()
    agent = bench.default_rollout()
    assert agent.name == "terminal" and bench.eval_defaults == {"max_tokens": TURN_TOKENS}
    with start_fake_upstream(scripted([bash("true")])) as up:
        ep = await run(up, sandbox, agent=agent)
        assert ep.artifacts["stop_reason"] == "max_turns" and ep.artifacts["turns"] == MAX_TURNS
        assert ep.artifacts["max_turns"] == MAX_TURNS
        capped = Task(id="t2", instruction="Make /app/out.txt say hello.", metadata={"max_turns": 2})
        ep = await run(up, sandbox, task=capped, agent=agent)
        assert ep.artifacts["turns"] == 2
        ep = await run(up, sandbox, task=capped, agent=agent, max_turns=3)
        assert ep.artifacts["turns"] == 3


async def test_server_errors_end_the_episode_with_model_error(sandbox: SubprocessSandbox) -> None:
    def broken(body: dict[str, Any]) -> Any:
        raise RuntimeError("upstream bug")

    with start_fake_upstream(broken) as up:
        ep = await run(up, sandbox)
    assert ep.error is None and ep.artifacts["stop_reason"] == "model_error" and "500" in ep.artifacts["error"]


# ------------------------------------------------------------------------------------------------ (a) options
async def test_options_are_checked_and_layered(sandbox: SubprocessSandbox) -> None:
    with pytest.raises(ConfigError, match=r"bad option 'max_turn'.*the options are max_turns"):
        make_terminal_agent(max_turn=3)
    short = make_terminal_agent(name="short", max_turns=2)
    with start_fake_upstream(scripted([bash("true")])) as up:
        ep = await run(up, sandbox, agent=short)
        assert ep.artifacts["stop_reason"] == "max_turns" and ep.trajectories[0].name == "short"
        assert len(ep.steps) == 2
        task = Task(id="t", instruction="x", metadata={"terminal_agent": {"max_turns": 1}})
        assert len((await run(up, sandbox, task=task, agent=short)).steps) == 1  # the task's option wins
        bad = await run(up, sandbox, task=Task(id="u", instruction="x", metadata={"terminal_agent": {"turns": 1}}))
    assert bad.termination_reason == "error" and "task.metadata['terminal_agent']" in (bad.error or "")


async def test_outside_a_sandboxed_episode_the_error_says_so() -> None:
    with start_fake_upstream(scripted(["DONE"])) as up:
        ep = await terminal_agent.arun(Task(id="t", instruction="x"), base_url=up.base_url, model="fake")
    assert ep.termination_reason == "error" and "no sandbox here" in (ep.error or "")


# ------------------------------------------------------------------------------------------------ (a) with a verifier
def _harbor_task(root: Path) -> Path:
    task = root / "hello"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n')
    (task / "instruction.md").write_text("Write the word hello into /app/greeting.txt.\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(
        '#!/bin/bash\nif [ "$(cat /app/greeting.txt 2>/dev/null)" = hello ]; then echo 1 > /logs/verifier/reward.txt; '
        "else echo 0 > /logs/verifier/reward.txt; fi\n")
    return task


@pytest.mark.parametrize(("command", "reward"), [("echo hello > /app/greeting.txt", 1.0),
                                                  ("echo goodbye > /app/greeting.txt", 0.0)])
async def test_rewards_are_exact_with_the_harbor_verifier(tmp_path: Path, command: str, reward: float) -> None:
    """The default agent of `harbor:PATH`, wrapped by H1's HarborBenchmark (sandbox, agent, verifier) on the real local
    (bubblewrap) provider: its command decides the reward. (Not the double: it maps paths only in commands, and
    test.sh writes /logs/verifier by its absolute path.)"""
    from rllm_envs.harbor.benchmark import HarborBenchmark
    from rllm_sandboxes.local import LocalSandbox, LocalSandboxProvider

    started: list[LocalSandbox] = []

    class Recording(LocalSandboxProvider):
        def start(self, spec: EnvironmentSpec) -> LocalSandbox:
            started.append(super().start(spec))
            return started[-1]

    _harbor_task(tmp_path / "tasks")
    bench = HarborBenchmark(tmp_path / "tasks", agent=terminal_agent)
    [task] = bench.load()
    assert bench.default_rollout() is terminal_agent
    wrapped = bench.wrap_rollout(terminal_agent, sandbox=Recording())
    with start_fake_upstream(scripted([bash(command), "Finished."])) as up:
        ep = await wrapped.arun(task, base_url=up.base_url, model="fake", sampling=SAMPLING)
    result = bench.score(task, ep)
    assert (result.reward, result.reason) == (reward, "correct" if reward else "wrong_answer"), result
    assert ep.error is None and ep.artifacts["stop_reason"] == "done" and len(ep.steps) == 2
    assert ep.artifacts["commands"][0]["exit_code"] == 0 and ep.artifacts["harbor"]["phase"] == "done"
    assert ep.artifacts["time_budget_s"] == 54.0  # the task's 60 s agent timeout, less 10 %
    assert up.requests[0]["messages"][1]["content"].startswith("Write the word hello")
    assert len(started) == 1 and started[0].closed and not started[0].host_dir.exists()


# ------------------------------------------------------------------------------------------------ (b) end to end
@pytest.mark.slow
def test_end_to_end_on_the_tiny_random_policy_server(sandbox: SubprocessSandbox) -> None:
    """The default agent (`auto`) against `rllm serve --model tiny-random`'s server, through the gateway with exact
    turns. What this exercises for real: tiny-random's chat template has no tools, so the server writes the `bash`
    tool into the prompt (the Hermes convention) and the agent keeps its tool format; the random model never calls
    it, so each reply is a format error answered with a user message, until `max_format_errors`; the turns pack
    into ONE row per trajectory whose re-prompts are mask-0 runs between the mask-1 completions. What it cannot
    exercise: a command chosen by the model (the fake-upstream tests above cover commands, tool messages and their
    masking semantics)."""
    from rllm_rollout.engine import run_episodes
    from rllm_rollout.gateway import start_gateway
    from rllm_serve import start_policy_server
    from rllm_train.packing import pack_trajectory

    server = start_policy_server("tiny-random")
    try:
        gateway = start_gateway([server.upstream_config()])
        try:
            async def main() -> list[Episode]:
                with sandbox_scope(sandbox):
                    return await run_episodes(terminal_agent, [Task(id=f"e{i}", instruction="List the files in "
                                                                    "/app.") for i in range(2)],
                                              gateway=gateway, model=server.model_name, concurrency=1,
                                              sampling={"temperature": 1.0, "max_tokens": 8, "seed": 3},
                                              progress=False)
            episodes = asyncio.run(main())
        finally:
            gateway.stop()
    finally:
        server.stop()
    assert [e.error for e in episodes] == [None, None]
    assert [e.artifacts["stop_reason"] for e in episodes] == ["format_errors"] * 2
    assert all(e.artifacts["action_format"] == "tools" for e in episodes)
    assert all(len(e.steps) == 3 and all(s.error is None for s in e.steps) for e in episodes)
    for ep in episodes:
        rows, metrics = pack_trajectory(ep.trajectories[0], 1.0)
        assert len(rows) == 1 and metrics["steps_used"] == 3, metrics
        mask = rows[0].loss_mask
        runs = [mask[0]] + [b for a, b in itertools.pairwise(mask) if a != b]
        assert runs == [0, 1, 0, 1, 0, 1], runs  # prompt, reply, re-prompt, reply, re-prompt, reply
        assert sum(mask) == sum(len(s.completion_token_ids or []) for s in ep.steps)


# ------------------------------------------------------------------------------------------------ the LangGraph example
def test_langgraph_example_runs_its_bash_tool_in_the_sandbox(sandbox: SubprocessSandbox,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/agents/langgraph_bash.py, unchanged: ChatOpenAI + ToolNode; the tool body reaches current_sandbox()
    from the ToolNode's worker thread; steps are named by graph node through the adapter's callback handler."""
    import importlib

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples" / "agents"))  # as `cd` does
    monkeypatch.delitem(sys.modules, "langgraph_bash", raising=False)
    example = importlib.import_module("langgraph_bash")
    replies = [bash("echo from-langgraph > /app/lg.txt; cat /app/lg.txt"), bash("exit 7"), "Done."]
    with start_fake_upstream(scripted(replies)) as up, sandbox_scope(sandbox):
        ep = example.solve.run(Task(id="lg", instruction="Write from-langgraph to /app/lg.txt."),
                               base_url=up.base_url, model="fake", sampling=SAMPLING)
    assert ep.error is None, ep.error
    assert ep.artifacts == {"answer": "Done.", "stop_reason": "done"}
    assert sandbox.host_path("/app/lg.txt").read_text() == "from-langgraph\n"
    assert [(t.name, len(t.steps)) for t in ep.trajectories] == [("agent", 3)]
    assert [t["content"] for t in tool_messages(up.requests[-1])] == ["exit code: 0\nfrom-langgraph\n",
                                                                      "exit code: 7\n(no output)"]
    assert "/app" in up.requests[0]["messages"][0]["content"] and up.requests[0]["max_completion_tokens"] == 512
