"""`rllm train` from the command line: a real (tiny) run on the arithmetic benchmark with the local backend,
then `--resume` of the same run directory, and bad flags reported without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.runs.checkpoints import latest_checkpoint

runner = CliRunner()
SMALL = ["--model", "tiny-random", "--batch-size", "2", "--group-size", "2", "--max-tokens", "8",
         "--eval-examples", "2", "--save-every", "1", "--no-progress", "--lr", "1e-4"]


@pytest.mark.slow
def test_train_then_resume_on_arithmetic(tmp_path: Path) -> None:
    out = tmp_path / "arith-01"
    res = runner.invoke(build_app(), ["train", "arithmetic", "--max-steps", "2", "--output", str(out), *SMALL])
    assert res.exit_code == 0, res.output
    assert "step    2  reward" in res.output and "eval    2  sampled acc" in res.output
    # the figures say what they are measured under, and how to compare base and trained the way users do
    assert ("validation: 2 test tasks, 1 attempt each sampled at temperature 1, and greedy, ≤ 8 tokens per reply"
            in res.output)
    assert f"rllm eval arithmetic --model tiny-random  and  rllm eval arithmetic --model {out}" in res.output
    assert "validation settings (2 test tasks, 1 attempt" in res.output  # the tasks evaluated, counted
    assert latest_checkpoint(out / "checkpoints") == out / "checkpoints" / "step_2"
    res = runner.invoke(build_app(), ["train", "arithmetic", "--max-steps", "1", "--output", str(out), *SMALL])
    assert res.exit_code == 1 and "already holds a training run" in res.output  # never mixed into
    res = runner.invoke(build_app(), ["train", "--resume", str(out), "--max-steps", "3", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "step    3  reward" in res.output and "step    2" not in res.output
    assert "done: 3 steps, held-out accuracy 0." in res.output and " → " in res.output  # first eval of the run
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == [1, 2, 3]
    assert all(r["policy_version"] >= 1 for r in records if r["kind"] == "train" and "skipped" not in r)
    assert {"train/grad_norm", "train/entropy", "train/tokens_per_s", "reward/mean"} <= set(records[1])
    assert (out / "episodes" / "step_3.jsonl").exists()
    assert "max_steps: 3" in (out / "config.yaml").read_text()


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    res = runner.invoke(build_app(), ["train", "arithmetic", "--group-size", "1", "--output", str(tmp_path)])
    assert res.exit_code == 1 and "--group-size 2 or more" in res.output and "Traceback" not in res.output
    res = runner.invoke(build_app(), ["train", "--resume", str(tmp_path / "nothing")])
    assert res.exit_code == 1 and "no config.yaml" in res.output
