"""Harbor task directories: loading (and its errors), the sandboxed episode (agent → verifier → reward with a
reason), the oracle and nop agents, `harbor:PATH` through the benchmark registry.

Episodes run through the real local (bubblewrap) provider when it is installed, else through the subprocess
double of `rllm_testing.sandbox_double`. The tasks' scripts find /logs as the sibling of /tests (`$0/..`) and
/app as their working directory, so the same files run in both (the double maps paths only in command strings).
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rllm_core.errors import BenchmarkError
from rllm_core.sandbox import EnvironmentSpec, SandboxError, aexec, current_sandbox
from rllm_envs.harbor import (
    HarborBenchmark,
    HarborTaskError,
    HarborTaskWarning,
    load_task,
    load_tasks,
    nop,
    oracle,
    run_harbor_episode,
    to_environment_spec,
)
from rllm_rollout.benchmarks.registry import get_benchmark
from rllm_rollout.rollout import rollout
from rllm_testing.sandbox_double import SubprocessSandboxProvider

LOGS = 'LOGS="$(cd "$(dirname "$0")/.." && pwd)/logs/verifier"; mkdir -p "$LOGS"'
"""The verifier's reward folder, /logs/verifier, found relative to /tests/test.sh (see the module docstring)."""


def _write_task(root: Path, name: str, *, toml: str = "", test: str, solve: str | None = None,
                files: dict[str, str] | None = None, instruction: str = "Do the thing in /app.",
                dockerfile: str = "FROM ubuntu:24.04\nWORKDIR /app\n") -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(textwrap.dedent(toml) or "[verifier]\ntimeout_sec = 30\n")
    (task / "instruction.md").write_text(instruction)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        (task / "environment" / rel).write_text(text)
    (task / "tests" / "test.sh").write_text(f"#!/bin/bash\nset -u\n{LOGS}\n{textwrap.dedent(test)}")
    if solve is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -eu\n{textwrap.dedent(solve)}")
    return task


def _pass_if(cond: str) -> str:
    return f'if {cond}; then echo 1 > "$LOGS/reward.txt"; else echo 0 > "$LOGS/reward.txt"; fi\n'


@pytest.fixture
def task_set(tmp_path: Path) -> Path:
    """Three tiny tasks with oracle solutions."""
    root = tmp_path / "tasks"
    _write_task(root, "count-lines", files={"input.txt": "a\nb\nc\n"},
                toml="""
                [metadata]
                difficulty = "easy"
                category = "files"
                [agent]
                timeout_sec = 60
                [verifier]
                timeout_sec = 30
                [environment]
                cpus = 1
                memory_mb = 1024
                """,
                test=_pass_if('[ "$(tr -d " \\n" < out.txt 2>/dev/null)" = "3" ]'),
                solve="wc -l < input.txt > out.txt\n")
    _write_task(root, "json-score", files={"data.txt": "7\n"},
                test='if [ -f answer.txt ] && [ "$(cat answer.txt)" = "$(cat data.txt)" ]; then\n'
                     '  echo \'{"reward": 1.0, "exact": 1}\' > "$LOGS/reward.json"\n'
                     'else echo \'{"reward": 0.0, "exact": 0}\' > "$LOGS/reward.json"; fi\n',
                solve="cp data.txt answer.txt\n")
    _write_task(root, "make-script",
                test=_pass_if('[ -x hello.sh ] && [ "$(./hello.sh)" = "hello" ]'),
                solve="printf '#!/bin/bash\\necho hello\\n' > hello.sh && chmod +x hello.sh\n")
    return root


class _Recording:
    """Wraps a provider: keeps every sandbox it started, and whether each was closed."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, getattr(inner, "name", "inner")
        self.sandboxes: list[Any] = []
        self.closed: list[bool] = []

    def start(self, spec: EnvironmentSpec) -> Any:
        sandbox = self.inner.start(spec)
        index = len(self.sandboxes)
        self.sandboxes.append(sandbox)
        self.closed.append(False)
        real_close = sandbox.close

        def close() -> None:
            self.closed[index] = True
            real_close()

        sandbox.close = close
        return sandbox


def _local_provider() -> Any | None:
    try:
        from rllm_sandboxes.local import plugin
    except ImportError:
        return None
    specs = {s.name: s for s in plugin.rllm_register_sandbox_providers()}
    try:
        return specs["local"].factory()
    except Exception:
        return None


@pytest.fixture
def provider() -> Iterator[_Recording]:
    inner = _local_provider() or SubprocessSandboxProvider()
    rec = _Recording(inner)
    yield rec
    for sandbox in rec.sandboxes:
        sandbox.close()


def _run(task_dir: Path, agent: Any, provider: Any, **kw: Any) -> Any:
    return asyncio.run(run_harbor_episode(load_task(task_dir), agent, provider, **kw)).verdict


# ------------------------------------------------------------------------------------------------ loading
def test_load_tasks_reads_harbor_fields(task_set: Path) -> None:
    tasks = load_tasks(task_set)
    assert [t.id for t in tasks] == ["count-lines", "json-score", "make-script"]
    first = tasks[0]
    assert first.instruction == "Do the thing in /app." and first.workdir == "/app" and first.has_solution
    assert (first.agent_timeout_s, first.verifier_timeout_s) == (60.0, 30.0)
    assert first.metadata == {"difficulty": "easy", "category": "files"}
    assert first.dockerfile == task_set / "count-lines" / "environment" / "Dockerfile"
    assert [t.id for t in load_tasks(task_set / "json-score")] == ["json-score"]  # one task dir is a set of one
    spec = to_environment_spec(first)
    assert (spec.name, spec.workdir, spec.network, spec.image) == ("count-lines", "/app", False, None)
    assert (spec.resources.cpus, spec.resources.memory_mb, spec.resources.timeout_s) == (1.0, 1024, 60.0)
    assert spec.environment_dir == task_set / "count-lines" / "environment"


def test_spec_workdir_network_env_and_deprecated_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARBOR_TEST_TOKEN", "s3cret")
    task = _write_task(tmp_path, "t", test="true\n", dockerfile="FROM python:3.12\nWORKDIR /srv\nWORKDIR code\n",
                       toml="""
                       version = "1.0"
                       [environment]
                       allow_internet = true
                       memory = "1G"
                       docker_image = "python:3.12"
                       env = { TOKEN = "${HARBOR_TEST_TOKEN}", MODE = "${HARBOR_UNSET_VAR:-fast}" }
                       """)
    spec = to_environment_spec(load_task(task))
    assert (spec.workdir, spec.network, spec.image) == ("/srv/code", True, "python:3.12")
    assert spec.resources.memory_mb == 1024
    assert dict(spec.env) == {"TOKEN": "s3cret", "MODE": "fast"}
    (task / "task.toml").write_text('[environment]\nenv = { K = "${HARBOR_UNSET_VAR}" }\n')
    with pytest.raises(HarborTaskError, match="HARBOR_UNSET_VAR"):
        to_environment_spec(load_task(task))


def test_malformed_tasks_are_named(tmp_path: Path) -> None:
    no_toml = _write_task(tmp_path, "no-toml", test="true\n")
    (no_toml / "task.toml").unlink()
    with pytest.raises(HarborTaskError, match=r"no-toml/task\.toml: missing"):
        load_task(no_toml)

    no_test = _write_task(tmp_path, "no-test", test="true\n")
    (no_test / "tests" / "test.sh").unlink()
    with pytest.raises(HarborTaskError, match=r"no-test/tests/test\.sh: missing"):
        load_task(no_test)

    bad = _write_task(tmp_path, "bad-toml", test="true\n", toml="[agent]\ntimeout_sec = 10\n[verifier\n")
    with pytest.raises(HarborTaskError, match=r"bad-toml/task\.toml: invalid TOML: .*line 3"):
        load_task(bad)

    wrong_type = _write_task(tmp_path, "wrong-type", test="true\n", toml='[environment]\ncpus = "many"\n')
    with pytest.raises(HarborTaskError, match=r"wrong-type/task\.toml: environment\.cpus"):
        load_task(wrong_type)

    no_instruction = _write_task(tmp_path, "no-instruction", test="true\n")
    (no_instruction / "instruction.md").unlink()
    with pytest.raises(HarborTaskError, match=r"instruction\.md: missing"):
        load_task(no_instruction)

    # A set reports every malformed task at once, with the count.
    with pytest.raises(HarborTaskError, match=r"5 of 5 tasks .* are malformed") as info:
        load_tasks(tmp_path)
    for name in ("no-toml", "no-test", "bad-toml", "wrong-type", "no-instruction"):
        assert name in str(info.value)
    with pytest.raises(HarborTaskError, match="no such directory"):
        load_tasks(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarborTaskError, match="no tasks here"):
        load_tasks(tmp_path / "empty")


def test_unknown_keys_warn_not_refuse(tmp_path: Path) -> None:
    task = _write_task(tmp_path, "typo", test="true\n", toml="[agent]\ntimout_sec = 5\n[extras]\nx = 1\n")
    with pytest.warns(HarborTaskWarning, match=r"\[agent\] timout_sec.*|extras"):
        loaded = load_task(task)
    assert set(loaded.unknown_keys) == {"extras", "[agent] timout_sec"}
    steps = _write_task(tmp_path, "steps", test="true\n", toml='[[steps]]\nname = "a"\n')
    with pytest.raises(HarborTaskError, match=r"multi-step"):
        load_task(steps)


# ------------------------------------------------------------------------------------------------ episodes
def test_oracle_scores_one_and_nop_zero(task_set: Path, provider: _Recording) -> None:
    for task in load_tasks(task_set):
        good = asyncio.run(run_harbor_episode(task, oracle, provider)).verdict
        assert (good.reason, good.reward, good.phase) == ("correct", 1.0, "done"), (task.id, good)
        bad = asyncio.run(run_harbor_episode(task, nop, provider)).verdict
        assert (bad.reason, bad.reward) == ("wrong_answer", 0.0), (task.id, bad)
    assert len(provider.sandboxes) == 6 and all(provider.closed)
    json_task = load_task(task_set / "json-score")
    assert asyncio.run(run_harbor_episode(json_task, oracle, provider)).verdict.rewards == {"reward": 1.0, "exact": 1}


def test_agent_never_sees_tests_and_planted_rewards_do_not_count(tmp_path: Path, provider: _Recording) -> None:
    task = _write_task(tmp_path, "t", test="echo 'checked' \n")  # writes no reward itself
    seen: dict[str, str] = {}

    @rollout
    async def cheater(task: Any, config: Any) -> None:
        sb = current_sandbox()
        seen["tests"] = (await aexec(sb, "ls -A /tests 2>/dev/null | wc -l")).output.strip()
        await aexec(sb, "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")

    verdict = _run(task, cheater, provider)
    assert seen["tests"] == "0"
    assert verdict.reason == "verifier_error" and verdict.reward == 0.0
    assert "wrote no /logs/verifier/reward.txt" in verdict.note and "checked" in verdict.note


def test_verifier_without_reward_is_verifier_error_with_its_stderr(tmp_path: Path, provider: _Recording) -> None:
    task = _write_task(tmp_path, "t", test="echo 'pytest: ModuleNotFoundError: no module named foo' >&2\nexit 3\n")
    verdict = _run(task, nop, provider)
    assert (verdict.reason, verdict.phase, verdict.verifier_exit_code) == ("verifier_error", "verifier", 3)
    assert "ModuleNotFoundError" in verdict.note and "ModuleNotFoundError" in verdict.verifier_output
    assert "exited 3" in verdict.note
    assert verdict.to_reward_result().reason == "verifier_error" and all(provider.closed)


@pytest.mark.parametrize(("write", "reason", "reward", "note"), [
    ('echo oops > "$LOGS/reward.txt"', "verifier_error", 0.0, "not a number"),
    ('echo "{not json" > "$LOGS/reward.json"', "verifier_error", 0.0, "not JSON"),
    ('echo \'{"a": 1, "b": 2}\' > "$LOGS/reward.json"', "verifier_error", 0.0, "no numeric 'reward'"),
    ('echo \'{"score": 0.25}\' > "$LOGS/reward.json"', "wrong_answer", 0.25, "0.25"),
    ('echo 0.5 > "$LOGS/reward.txt"', "wrong_answer", 0.5, "0.5"),
])
def test_reward_files(tmp_path: Path, provider: _Recording, write: str, reason: str, reward: float,
                      note: str) -> None:
    verdict = _run(_write_task(tmp_path, "t", test=write + "\n"), nop, provider)
    assert (verdict.reason, verdict.reward) == (reason, reward) and note in verdict.note


def test_agent_timeout_and_verifier_timeout(tmp_path: Path, provider: _Recording) -> None:
    @rollout
    async def slow(task: Any, config: Any) -> None:
        await asyncio.sleep(30)

    task = _write_task(tmp_path, "slow-agent", toml="[agent]\ntimeout_sec = 0.5\n", test=_pass_if("true"))
    verdict = _run(task, slow, provider)
    assert (verdict.reason, verdict.phase) == ("timeout", "agent") and "agent timed out after 0.5 s" in verdict.note
    assert verdict.to_reward_result().reason == "timeout"

    slow_test = _write_task(tmp_path, "slow-verifier", toml="[verifier]\ntimeout_sec = 1\n", test="sleep 30\n")
    verdict = _run(slow_test, nop, provider)
    assert (verdict.reason, verdict.phase) == ("timeout", "verifier") and "verifier" in verdict.note
    assert len(provider.closed) == 2 and all(provider.closed)


def test_provider_that_cannot_start_is_sandbox_error(tmp_path: Path) -> None:
    class Broken:
        name = "broken"

        def start(self, spec: EnvironmentSpec) -> Any:
            raise SandboxError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")

    verdict = _run(_write_task(tmp_path, "t", test="true\n"), nop, Broken())
    assert (verdict.reason, verdict.phase) == ("sandbox_error", "start")
    assert "apt-get install bubblewrap" in verdict.note
    assert verdict.to_reward_result().reason == "sandbox_error"


def test_sandbox_closed_when_agent_raises_or_is_cancelled(tmp_path: Path, provider: _Recording) -> None:
    task = load_task(_write_task(tmp_path, "t", test=_pass_if("true")))

    @rollout
    def crashing(task: Any, config: Any) -> None:
        raise RuntimeError("agent bug")

    with pytest.raises(RuntimeError, match="agent bug"):
        asyncio.run(run_harbor_episode(task, crashing, provider))
    assert provider.closed == [True]

    @rollout
    async def hanging(task: Any, config: Any) -> None:
        await asyncio.sleep(60)

    async def cancel_it() -> None:
        job = asyncio.create_task(run_harbor_episode(task, hanging, provider))
        while len(provider.sandboxes) < 2:
            await asyncio.sleep(0.01)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    asyncio.run(cancel_it())
    assert provider.closed == [True, True]


# ------------------------------------------------------------------------------------------------ the benchmark
def test_harbor_prefix_resolves_and_runs_through_the_engine(task_set: Path, provider: _Recording) -> None:
    from rllm_rollout.engine import run_episodes

    bench = get_benchmark(f"harbor:{task_set}")
    assert isinstance(bench, HarborBenchmark) and bench.name == f"harbor:{task_set}"
    assert bench.rows() == 3 and bench.named_agent("zzz") is None
    tasks = bench.load()
    assert [t.id for t in tasks] == ["count-lines", "json-score", "make-script"]
    assert tasks[0].metadata["difficulty"] == "easy" and tasks[0].instruction == "Do the thing in /app."
    for name, reward, reason in (("oracle", 1.0, "correct"), ("nop", 0.0, "wrong_answer")):
        agent = bench.wrap_rollout(bench.named_agent(name), sandbox=provider)
        assert bench.wrap_rollout(agent, sandbox=provider) is agent  # wrapping twice is wrapping once
        episodes = asyncio.run(run_episodes(agent, tasks, base_url="http://127.0.0.1:9/v1", benchmark=bench,
                                            progress=False, concurrency=2))
        assert [(e.reward, e.reward_reason) for e in episodes] == [(reward, reason)] * 3, [e.error for e in episodes]
        assert all(e.artifacts["harbor"]["task_id"] == e.task.id for e in episodes)
        assert all(e.rollout == name for e in episodes)
    assert len(provider.sandboxes) == 6 and all(provider.closed)


def test_score_without_verdict_and_bad_prefixes(task_set: Path, tmp_path: Path) -> None:
    from rllm_core.types import Episode

    bench = get_benchmark(f"harbor:{task_set}")
    assert bench.default_rollout().name == "terminal"  # the built-in terminal agent
    with pytest.raises(BenchmarkError, match="no default agent"):
        HarborBenchmark(task_set).default_rollout()  # a task set of your own: you say which agent
    assert bench.load(max_examples=2)[-1].id == "json-score"
    task = bench.load()[0]
    unwrapped = bench.score(task, Episode(task=task, artifacts={"answer": "done"}))
    assert unwrapped.reason == "error" and "wrap_rollout" in unwrapped.details["note"]
    assert bench.score(task, Episode(task=task, termination_reason="error", error="boom")).reason == "error"
    with pytest.raises(BenchmarkError, match="needs a path"):
        get_benchmark("harbor:")
    with pytest.raises(HarborTaskError, match="no such directory"):
        get_benchmark(f"harbor:{tmp_path / 'missing'}")


def test_a_verifier_killed_by_its_program_does_not_trust_the_reward_file(tmp_path: Path) -> None:
    """The optimiser's shortcut: code the verifier runs writes reward 1 and kills the verifier."""
    from rllm_envs.harbor.agents import nop
    from rllm_envs.harbor.episode import run_harbor_episode
    from rllm_envs.harbor.task import load_task
    from rllm_testing.sandbox_double import SubprocessSandboxProvider

    task_dir = tmp_path / "sneaky"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "environment").mkdir()
    (task_dir / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task_dir / "instruction.md").write_text("Do nothing.\n")
    (task_dir / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30\n')
    (task_dir / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\nkill -9 $$\n")
    episode = asyncio.run(run_harbor_episode(load_task(task_dir), nop, SubprocessSandboxProvider()))
    assert episode.verdict.reason == "verifier_error" and episode.verdict.reward == 0.0
    assert "killed" in episode.verdict.note
