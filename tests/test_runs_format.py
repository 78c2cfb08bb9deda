"""The run directory written by real runs: a short `train` (fake upstream + RecordingBackend) and a real
`run_eval`, read back with RunReader: run.json, heartbeat, log.txt, metrics, episodes with their sidecars."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rllm_core.errors import TrainingError
from rllm_core.io import read_jsonl
from rllm_core.runs import FORMAT, RunReader, index_path
from rllm_core.types import Episode
from rllm_envs.eval.runner import EvalOptions, run_eval
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder, yesno_config
from rllm_train.loop import train


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(alternating_responder()) as up:
        yield up


_config = yesno_config


def test_a_train_run_writes_the_format_and_reads_back(tmp_path: Path, upstream: FakeUpstream) -> None:
    result = train(_config(tmp_path), backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(),
                   progress=False)
    run = result.run_dir
    meta = json.loads((run / "run.json").read_text())
    assert meta["format"] == FORMAT and meta["kind"] == "train" and isinstance(meta["pid"], int)
    assert {"started", "host", "argv"} <= set(meta)
    beat = json.loads((run / "heartbeat.json").read_text())
    assert beat["status"] == "finished" and beat["step"] == 3 and "error" not in beat
    log = (run / "log.txt").read_text()
    assert "step    1  reward 0.500" in log and "eval    3  sampled acc" in log and "[bold]" not in log

    reader = RunReader(run)
    info = reader.info()
    assert (info.kind, info.status, info.benchmark, info.backend, info.step, info.max_steps) == (
        "train", "finished", "yesno", "local", 3, 3)
    assert info.reward == pytest.approx(0.5) and info.accuracy == pytest.approx(0.5)
    assert info.val_accuracy is not None and info.started == meta["started"] and info.updated >= info.started
    files = reader.files()
    assert [(f["name"], f["kind"], f["step"], f["episodes"]) for f in files] == [
        ("eval_step_0", "eval", 0, 2), ("step_1", "train", 1, 4), ("step_2", "train", 2, 4),
        ("step_3", "train", 3, 4), ("eval_step_3", "eval", 3, 2)]
    records, nxt, partial = reader.metrics()
    assert [r["kind"] for r in records] == ["eval", "train", "train", "train", "eval"] and (nxt, partial) == (5, 0)
    written = read_jsonl(run / "episodes" / "step_2.jsonl")
    assert index_path(run / "episodes" / "step_2.jsonl").is_file()
    for i, ep in enumerate(written):
        assert Episode.model_validate(reader.episode("step_2", i)) == ep
    summ = reader.summaries("step_2")
    assert [s["task_id"] for s in summ] == [e.task.id for e in written]
    assert [s["reason"] for s in summ] == [e.reward_reason for e in written]
    assert all(s["has_token_ids"] and s["n_steps"] == 1 and s["response_tokens"] > 0 for s in summ)
    assert reader.config()["config"]["max_steps"] == 3 and "max_steps: 3" in reader.config()["text"]


def test_a_failed_train_run_says_failed_with_its_error(tmp_path: Path, upstream: FakeUpstream) -> None:
    with pytest.raises(TrainingError):
        train(_config(tmp_path, max_steps=4, eval_examples=0),
              backend=RecordingBackend(upstream.base_url, fail_at_step=2), benchmark=YesNoBenchmark(),
              progress=False)
    info = RunReader(tmp_path / "run").info()
    assert info.status == "failed" and "training stopped at step 2" in (info.error or "")
    assert info.step == 1


class _Interrupted(RecordingBackend):
    def train_step(self, rows: list) -> dict:  # type: ignore[override]
        raise KeyboardInterrupt


def test_ctrl_c_marks_the_run_failed_interrupted(tmp_path: Path, upstream: FakeUpstream) -> None:
    with pytest.raises(KeyboardInterrupt):
        train(_config(tmp_path, eval_examples=0), backend=_Interrupted(upstream.base_url),
              benchmark=YesNoBenchmark(), progress=False)
    beat = json.loads((tmp_path / "run" / "heartbeat.json").read_text())
    assert beat["status"] == "failed" and beat["error"] == "interrupted"
    assert RunReader(tmp_path / "run").info().status == "failed"


def _gsm8k_responder(body: dict) -> str:
    return "So the answer is \\boxed{18}." if "Janet" in str(body["messages"]) else "I think it is \\boxed{1}."


def test_an_eval_run_writes_the_same_format(tmp_path: Path, shared_data_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLLM_DATA_DIR", str(shared_data_dir))
    out = tmp_path / "ev"
    with start_fake_upstream(_gsm8k_responder) as up:
        result = run_eval(EvalOptions(benchmark="gsm8k", max_examples=3, attempts=2, base_url=up.base_url,
                                      model="fake", output=out, progress=False, api_key="secret"))
    assert result.episodes_path == out / "episodes.jsonl"  # where users and older tests read it
    assert json.loads((out / "run.json").read_text())["kind"] == "eval"
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["benchmark"] == "gsm8k" and config["attempts"] == 2 and "api_key" not in config
    assert json.loads((out / "heartbeat.json").read_text())["status"] == "finished"
    reader = RunReader(out)
    (record,), n_records, _ = reader.metrics()
    assert n_records == 1
    assert record["kind"] == "eval" and record["reward/accuracy"] == pytest.approx(result.summary.accuracy)
    assert record["episode/count"] == 6 and record["pass@2"] == result.summary.pass_at_k["pass@2"]
    info = reader.info()
    assert (info.kind, info.status, info.benchmark, info.model, info.step, info.max_steps) == (
        "eval", "finished", "gsm8k", "fake", 6, 6)
    assert info.accuracy == pytest.approx(result.summary.accuracy)
    assert [(f["name"], f["kind"], f["episodes"]) for f in reader.files()] == [("eval", "eval", 6)]
    eps = read_jsonl(out / "episodes.jsonl")
    assert Episode.model_validate(reader.episode("eval", 5)) == eps[5]
    assert sorted(s["reason"] for s in reader.summaries("eval")) == sorted(e.reward_reason for e in eps)
