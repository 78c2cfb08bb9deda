"""`rllm plot RUN -o curves.png`: a PNG from a run's metrics.jsonl (one still being written: a cut last line),
read back by matplotlib; the panels follow what the run logged; bad input is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rllm_core.errors import ConfigError
from rllm_core.runs.reader import NotARunError, RunReadError
from rllm_monitor.plot import collect_series, plot_run, register_plot


def _train_record(step: int) -> dict[str, object]:
    return {"kind": "train", "step": step, "time": 1.0e9 + step, "reward/mean": 0.1 * step,
            "reward/accuracy": 0.05 * step, "episode/response_tokens_mean": 40.0 - step,
            "train/approx_kl": 0.001 * step, "train/clip_frac": 0.02, "train/entropy": 1.2 - 0.1 * step,
            "train/grad_norm": 0.5 + step, "throughput/tokens_per_s": 900.0 + step, "time/step_s": 2.0,
            "policy_version": step, "skipped": None}


def _write_run(path: Path, steps: int = 6, partial: bool = True) -> Path:
    """A train run directory as `rllm train` writes it: config.yaml, metrics.jsonl with train records, validation
    before training and at the end, and (while it runs) a last line cut mid-write."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("benchmark: arithmetic\nmodel: tiny-random\nbackend: local\nmax_steps: 6\n")
    records = [{"kind": "eval", "step": 0, "time": 1.0e9, "val/reward/accuracy": 0.1, "val/reward/mean": 0.1}]
    for step in range(1, steps + 1):
        records.append(_train_record(step))
    records.append({"kind": "eval", "step": steps, "time": 2.0e9, "val/reward/accuracy": 0.6,
                    "val/reward/mean": 0.6, "val/episode/response_tokens_mean": 30.0})
    records.append({"kind": "error", "step": steps, "time": 2.0e9, "error": "boom"})
    text = "".join(json.dumps(r) + "\n" for r in records)
    if partial:
        text += json.dumps(_train_record(steps + 1))[:40]  # the writer is mid-line
    (path / "metrics.jsonl").write_text(text)
    return path


def test_png_of_the_main_curves_reads_back(tmp_path: Path) -> None:
    import matplotlib.image

    run = _write_run(tmp_path / "arith-01")
    result = plot_run(run, tmp_path / "out" / "curves.png")
    assert result.path.stat().st_size > 10_000
    image = matplotlib.image.imread(str(result.path))
    assert image.ndim == 3 and image.shape[0] > 600 and image.shape[1] > 1200  # a 3-column grid
    assert image.std() > 0.05  # drawn on, not a blank canvas
    assert result.panels == ["reward", "accuracy", "response tokens (mean)",
                             "KL: update vs sampler (approx_kl), vs start (kl)", "clip fraction", "entropy",
                             "grad norm", "tokens / s", "step time (s)"]
    assert result.records == 9 and result.partial_lines == 1


def test_panels_follow_the_metrics_the_run_has(tmp_path: Path) -> None:
    run = tmp_path / "small"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "reward/mean": 0.5,
                                                   "train/grad_norm": 1.0}) + "\n")
    assert plot_run(run, tmp_path / "c.svg").panels == ["reward", "grad norm"]
    assert (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")
    chosen = plot_run(_write_run(tmp_path / "full"), tmp_path / "two.png", ["val/reward/accuracy", "train/entropy"])
    assert chosen.panels == ["val/reward/accuracy", "train/entropy"]


def test_series_keep_the_last_record_of_a_step_and_only_numbers() -> None:
    records = [{"kind": "train", "step": 1, "reward/mean": 0.1, "skipped": "no rows", "ok": True},
               {"kind": "train", "step": 2, "reward/mean": 0.2, "x": None},
               {"kind": "train", "step": 2, "reward/mean": 0.3},  # resumed: step 2 redone
               {"kind": "eval", "step": 2, "reward/mean": 0.9},
               {"kind": "error", "step": 2, "code": 1}, {"step": 3, "reward/mean": 1.0}]
    series = collect_series(records)
    assert series == {("reward/mean", "train"): [(1, 0.1), (2, 0.3)], ("reward/mean", "eval"): [(2, 0.9)]}


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NotARunError, match="is not an rllm run"):
        plot_run(tmp_path, tmp_path / "c.png")
    with pytest.raises(NotARunError, match="does not exist"):
        plot_run(tmp_path / "nope", tmp_path / "c.png")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text('{"kind": "train", "st')
    with pytest.raises(RunReadError, match="no metrics to plot yet"):
        plot_run(empty, tmp_path / "c.png")
    run = _write_run(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"did you mean reward/mean"):
        plot_run(run, tmp_path / "c.png", ["reward/man"])
    with pytest.raises(ConfigError, match=r"end the name with one of .*\.png"):
        plot_run(run, tmp_path / "curves.xyz")
    assert not list(tmp_path.glob("c.png"))


def test_plot_command(tmp_path: Path) -> None:
    app = typer.Typer()
    register_plot(app)
    app.command("noop")(lambda: None)  # a second command, so typer keeps `plot` as a subcommand
    run = _write_run(tmp_path / "run")
    res = CliRunner().invoke(app, ["plot", str(run), "-o", str(tmp_path / "curves.png"),
                                   "--metrics", "reward/mean,val/reward/accuracy"])
    assert res.exit_code == 0, res.output
    assert "2 panels from 9 records, 1 unreadable line(s) skipped" in " ".join(res.output.split())
    assert (tmp_path / "curves.png").stat().st_size > 0
    res = CliRunner().invoke(app, ["plot", str(tmp_path / "nope"), "-o", str(tmp_path / "x.png")])
    assert res.exit_code == 1 and "error:" in res.output and "Traceback" not in res.output
