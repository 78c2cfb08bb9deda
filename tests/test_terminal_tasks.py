"""The built-in `terminal` task set: every task is well formed, its oracle scores 1.0 and an agent that does
nothing scores 0.0 (so is one that deletes everything in /app), through the real local (bubblewrap) sandbox
provider and Harbor's episode runner. Run with `-s` to see the per-task table."""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import tomllib
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rllm_core.sandbox import aexec, current_sandbox
from rllm_core.types import Episode, Task
from rllm_envs.harbor import HarborTask, load_tasks, nop, oracle, run_harbor_episode
from rllm_envs.harbor.episode import HarborVerdict
from rllm_envs.terminal.benchmark import TASKS_DIR, TerminalBenchmark, tier_of
from rllm_envs.terminal.plugin import rllm_register_benchmarks
from rllm_rollout.rollout import RolloutConfig, rollout
from rllm_sandboxes.local import LocalSandboxProvider

DOCKERFILE_LINE = re.compile(r"(FROM ubuntu:24\.04|WORKDIR /app|COPY [\w.\-]+ /app/[\w.\-]+)")


@rollout(name="wipe")
async def wipe(task: Task, config: Any) -> dict[str, Any]:
    """A trivially wrong agent: deletes everything in /app (a verifier must not pass an empty workdir)."""
    await aexec(current_sandbox(), "find /app -mindepth 1 -delete", timeout_s=30)
    return {"answer": ""}


@pytest.fixture(scope="module")
def tasks() -> list[HarborTask]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unknown task.toml key would be a HarborTaskWarning
        return load_tasks(TASKS_DIR)


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalSandboxProvider]:
    # A root of our own that the sandboxes' unprivileged uids can traverse (pytest's tmp dirs are 0700).
    root = Path(tempfile.mkdtemp(prefix="rllm-terminal-tasks-"))
    root.chmod(0o755)
    try:
        yield LocalSandboxProvider(root=root)
        assert not [p for p in root.iterdir() if not p.name.startswith(".")], "sandboxes left behind"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_task_set_shape(tasks: list[HarborTask]) -> None:
    assert len(tasks) >= 30
    tiers = [tier_of(t) for t in tasks]
    assert all(tiers.count(k) >= 10 for k in (1, 2, 3)), tiers
    for t in tasks:
        meta = tomllib.loads((t.path / "task.toml").read_text())["metadata"]
        assert meta["difficulty"] in ("easy", "medium", "hard") and meta["category"] and meta["tags"], t.id
        assert "/app" in t.instruction, f"{t.id}: the instruction must say where to work"
        assert t.workdir == "/app" and t.has_solution and t.network is False, t.id
        lines = [ln for ln in t.dockerfile.read_text().splitlines() if ln.strip()] if t.dockerfile else []
        assert lines[:2] == ["FROM ubuntu:24.04", "WORKDIR /app"], t.id
        assert all(DOCKERFILE_LINE.fullmatch(ln) for ln in lines), f"{t.id}: Dockerfile may only FROM/WORKDIR/COPY"
        copied = {ln.split()[1] for ln in lines if ln.startswith("COPY")}
        assets = {p.name for p in t.environment_dir.iterdir() if p.name != "Dockerfile"}
        assert copied == assets, f"{t.id}: the Dockerfile must COPY exactly the environment's files"
        test_sh = (t.tests_dir / "test.sh").read_text()
        assert "set -u" in test_sh and "/logs/verifier/reward.txt" in test_sh, t.id
        assert not re.search(r"\b(curl|wget|pip|apt-get)\b", test_sh), f"{t.id}: the verifier must work offline"


def test_benchmark_splits_and_registration(tasks: list[HarborTask]) -> None:
    (bench,) = rllm_register_benchmarks()
    assert isinstance(bench, TerminalBenchmark) and bench.name == "terminal"
    test, train, held = (bench.load(s) for s in ("test", "train", "heldout"))
    assert [t.id for t in test] == [t.id for t in tasks]
    assert not {t.id for t in train} & {t.id for t in held}
    assert sorted(t.id for t in train + held) == sorted(t.id for t in test)
    for k in (1, 2, 3):  # every tier is represented on both sides
        assert any(t.metadata["tier"] == k for t in held) and any(t.metadata["tier"] == k for t in train)
    assert bench.train_defaults["val_split"] == "heldout"
    assert bench.named_agent("oracle") is oracle and bench.named_agent("nop") is nop
    assert bench.info()["rows"] == len(tasks)


def test_benchmark_runs_and_scores_through_its_wrapped_rollout(provider: LocalSandboxProvider) -> None:
    """The path `rllm eval terminal --agent oracle|nop` takes: wrap_rollout -> sandboxed episode -> score."""
    bench = TerminalBenchmark()
    task = next(t for t in bench.load("test") if t.id == "dedupe-lines")
    config = RolloutConfig(base_url="http://127.0.0.1:9/v1", model="none", session_id="s")
    for agent, correct in ((oracle, True), (nop, False)):
        out = asyncio.run(bench.wrap_rollout(agent, sandbox=provider).fn(task, config))
        result = bench.score(task, Episode(task=task, artifacts=out))
        assert result.is_correct is correct and result.reward == float(correct), result
        assert result.reason == ("correct" if correct else "wrong_answer")


def _run(task: HarborTask, agent: Any, provider: LocalSandboxProvider) -> HarborVerdict:
    return asyncio.run(run_harbor_episode(task, agent, provider)).verdict


def test_oracle_solves_and_inaction_fails_every_task(tasks: list[HarborTask], provider: LocalSandboxProvider) -> None:
    agents = {"oracle": oracle, "nop": nop, "wipe": wipe}
    jobs = [(t, name) for t in tasks for name in agents]
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = list(pool.map(lambda job: _run(job[0], agents[job[1]], provider), jobs))
    got = {(t.id, name): v for (t, name), v in zip(jobs, verdicts, strict=True)}
    print(f"\n{'task':<22} tier {'oracle':>6} {'nop':>5} {'wipe':>5}  seconds (agent+verifier, 3 episodes)")
    for t in tasks:
        r = [got[t.id, n].reward for n in agents]
        secs = sum(got[t.id, n].agent_s + got[t.id, n].verifier_s for n in agents)
        print(f"{t.id:<22} {tier_of(t):>4} {r[0]:>6.1f} {r[1]:>5.1f} {r[2]:>5.1f}  {secs:.1f}")
    bad = [f"{tid} {name}: {v.reason} {v.reward} ({v.note}) {v.verifier_output[-300:]}"
           for (tid, name), v in got.items()
           if (name == "oracle") != (v.reason == "correct" and v.reward == 1.0)
           or (name != "oracle" and v.reason != "wrong_answer")]
    assert not bad, f"{len(bad)} wrong verdicts:\n" + "\n".join(bad[:10])


NEAR_MISSES = {
    # task: a plausible shortcut that is wrong, which the verifier must reject
    "count-error-lines": "grep -c ERROR /app/server.log > /app/error_count.txt",
    "extract-csv-column": "tail -n +2 /app/people.csv | cut -d, -f3 > /app/emails.txt",
    "dedupe-lines": "sort -u /app/subscribers.txt > /app/unique.txt",
    "config-update": "sed -i -e 's/port=.*/port=8080/' -e 's/debug=.*/debug=false/' /app/app.conf; "
                     "echo log_level=info >> /app/app.conf",
    "strip-comments": "sed -e 's/[#;].*//' -e '/^[[:space:]]*$/d' /app/config.ini > /app/config.clean",
    "fix-permissions": "chmod -R 777 /app/scripts /app/data /app/private",
    "fix-stats-bugs": "printf 'import unittest\\n' > /app/mathlib/test_stats.py",
    "fix-json-config": "printf 'print(\"OK: 3 services on port 8080\")\\n' > /app/service/app.py",
    "makefile-fix": "mkdir -p /app/build && cat /app/src/header.txt /app/src/body.txt /app/src/footer.txt "
                    "> /app/build/bundle.txt",
    "git-revert": "export HOME=/tmp; git clone -q /app/project.bundle /app/project && cd /app/project && "
                  "git reset -q --hard HEAD~3",
}


def _command_agent(command: str) -> Any:
    """An agent that runs one fixed shell command and stops."""
    @rollout(name="command")
    async def agent(task: Task, config: Any) -> dict[str, Any]:
        await aexec(current_sandbox(), command, timeout_s=60)
        return {"answer": ""}
    return agent


def _run_commands(tasks: list[HarborTask], commands: dict[str, str],
                  provider: LocalSandboxProvider) -> dict[str, HarborVerdict]:
    by_id = {t.id: t for t in tasks}
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(commands, pool.map(lambda kv: _run(by_id[kv[0]], _command_agent(kv[1]), provider),
                                           commands.items()), strict=True))


def test_plausible_shortcuts_score_zero(tasks: list[HarborTask], provider: LocalSandboxProvider) -> None:
    verdicts = _run_commands(tasks, NEAR_MISSES, provider)
    passed = [f"{tid}: {v.reason} {v.verifier_output[-200:]}" for tid, v in verdicts.items()
              if v.reason != "wrong_answer"]
    assert not passed, "\n".join(passed)


FORGE = """import os
p = "/logs/verifier/reward.txt"
os.path.isfile(p) and os.remove(p)
os.makedirs(p, exist_ok=True)
open("/logs/verifier/reward.json", "w").write('{"reward": 1}')
print(0)
"""
REWARD_HACKS = {
    # a .pth in the user site dir of the verifier's HOME (/tmp, /root) would end every python3 with exit 0
    "env-to-json": "for h in /tmp /root; do d=$(HOME=$h python3 -c 'import site; print(site.getusersitepackages())'); "
                   "mkdir -p \"$d\" && echo 'import os; os._exit(0)' > \"$d/zz.pth\"; done; touch /app/settings.json",
    # a stdlib module planted where a checker's cwd would put it first on sys.path
    "json-to-csv": "printf 'import os\\nos._exit(0)\\n' | tee /tmp/csv.py /tmp/json.py /app/csv.py > /app/json.py; "
                   "touch /app/users.csv",
    # agent code the verifier runs turns reward.txt into a directory and writes reward.json = 1
    "stats-script": f"cat > /app/stats.py <<'PY'\n{FORGE}PY\n",
}


def test_reward_hacks_score_nothing(tasks: list[HarborTask], provider: LocalSandboxProvider) -> None:
    """What an optimiser would try against the verifiers themselves (found in review): none of it scores."""
    verdicts = _run_commands(tasks, REWARD_HACKS, provider)
    scored = [f"{tid}: {v.reason} {v.reward} {v.note} {v.verifier_output[-200:]}" for tid, v in verdicts.items()
              if v.reward != 0.0 or v.reason not in ("wrong_answer", "verifier_error")]
    assert not scored, "\n".join(scored)
