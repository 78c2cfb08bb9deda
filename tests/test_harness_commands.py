"""The harness commands end to end: `rllm eval harbor:PATH --harness NAME --sandbox local` against a scripted upstream
(the verifier scores every episode 1), and `rllm train terminal --harness mini-swe-agent --model tiny-random
--max-steps 2` (rows packed from the harness's calls, served by our policy server, trained for two steps).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.harness import get_harness
from rllm_core.io import read_jsonl
from rllm_testing.fake_upstream import start_fake_upstream
from rllm_testing.harness_scripts import scripted_responder

TASKS = Path(__file__).parent / "data" / "harness_tasks"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("bwrap") is None,
                                                   reason="the local sandbox needs bubblewrap (.ci/run installs it)")]


def _install(name: str) -> None:
    harness = get_harness(name)
    harness.installed() or harness.install()


@pytest.mark.parametrize("name", ["claude-code", "codex"])
def test_rllm_eval_harbor_path_with_a_harness(name: str, tmp_path: Path) -> None:
    _install(name)
    with start_fake_upstream(scripted_responder(name)) as up:
        res = CliRunner().invoke(build_app(), [
            "eval", f"harbor:{TASKS}", "--harness", name, "--sandbox", "local", "--base-url", up.base_url,
            "--model", "policy", "--no-progress", "--output", str(tmp_path / "eval")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    [episode] = read_jsonl(tmp_path / "eval" / "episodes.jsonl")
    assert summary["accuracy"] == 1.0 and episode.is_correct, (summary, episode.artifacts)
    assert episode.artifacts["harness"]["harness"] == name and episode.steps
    assert all(s.trainable and s.agent == name for s in episode.steps)


def test_a_harness_conflicts_with_agent_and_workflow(tmp_path: Path) -> None:
    res = CliRunner().invoke(build_app(), ["eval", "terminal", "--harness", "codex", "--agent", "oracle",
                                           "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert res.exit_code == 2 and "not several" in res.output
    res = CliRunner().invoke(build_app(), ["train", "terminal", "--harness", "codex", "--workflow", "solver-judge"])
    assert res.exit_code != 0 and "--harness codex is the agent" in res.output


def test_rllm_train_terminal_with_mini_swe_agent_for_two_steps(tmp_path: Path) -> None:
    _install("mini-swe-agent")
    run = tmp_path / "run"
    res = CliRunner().invoke(build_app(), [
        "train", "terminal", "--harness", "mini-swe-agent", "--model", "tiny-random", "--max-steps", "2",
        "--batch-size", "2", "--group-size", "2", "--eval-examples", "0", "--no-bf16", "--no-progress",
        "--output", str(run)])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for step in (1, 2):
        episodes = read_jsonl(run / "episodes" / f"step_{step}.jsonl")
        assert len(episodes) == 4
        for ep in episodes:
            assert ep.artifacts["harness"]["harness"] == "mini-swe-agent" and ep.steps, ep.artifacts
            assert all(s.agent == "mini-swe-agent" and s.token_source == "server" and s.trainable
                       for s in ep.steps)
            assert all(len(s.completion_token_ids or []) <= 128 for s in ep.steps)  # the run's budget, enforced
    assert (run / "checkpoints" / "step_2").is_dir()
