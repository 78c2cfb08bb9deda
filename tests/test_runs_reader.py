"""RunReader on runs being written and runs that died: partial lines, stale heartbeats, missing or short
sidecars, incremental polls, finding runs, and what a non-run is told."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rllm_core.runs import (
    STALE_AFTER_S,
    EpisodeWriter,
    NotARunError,
    RunReader,
    RunReadError,
    RunWriter,
    find_runs,
    index_path,
    write_episodes,
)
from rllm_core.types import Episode, Step, Task, Trajectory


def _episode(i: int, reason: str = "wrong_answer") -> Episode:
    step = Step(text=f"answer number {i}\n\n  with   spaces " + "x" * 300, completion_token_ids=[1, 2, 3],
                prompt_token_ids=[5], logprobs=[-0.1] * 3, token_source="server")
    return Episode(task=Task(id=f"t{i}"), trajectories=[Trajectory(steps=[step])], reward=float(i % 2),
                   reward_reason=reason, is_correct=bool(i % 2))


def test_metrics_of_a_run_being_written_skip_and_count_a_partial_line(tmp_path: Path) -> None:
    run = RunWriter(tmp_path / "r", "train").start(argv=["rllm", "train"], max_steps=10)
    run.log("train", 1, {"reward/mean": 0.25, "nan": float("nan")})
    run.log("train", 2, {"reward/mean": 0.5})
    with open(run.metrics_file, "a") as f:
        f.write('{"kind": "train", "step": 3, "rew')  # the writer is in the middle of a line
    reader = RunReader(tmp_path / "r")
    records, nxt, partial = reader.metrics()
    assert [r["step"] for r in records] == [1, 2] and (nxt, partial) == (2, 1) and records[0]["nan"] is None
    info = reader.info()
    assert (info.status, info.step, info.max_steps, info.reward) == ("running", 2, None, 0.5)
    with open(run.metrics_file, "a") as f:
        f.write('ard/mean": 0.75}\n')
    records, nxt, partial = reader.metrics(since=2)
    assert [r["step"] for r in records] == [3] and (nxt, partial) == (3, 0)
    assert reader.metrics(since=3) == ([], 3, 0)
    run.stop(None)
    assert reader.status() == ("finished", None)


def test_a_rewritten_metrics_file_is_read_again(tmp_path: Path) -> None:
    run = RunWriter(tmp_path / "r", "train")
    run.path.mkdir()
    for step in (1, 2, 3):
        run.log("train", step, {})
    reader = RunReader(tmp_path / "r")
    assert reader.metrics()[1] == 3
    kept = run.metrics_file.read_text().splitlines()[:1]
    tmp = run.metrics_file.with_suffix(".tmp")
    tmp.write_text("\n".join(kept) + "\n")
    tmp.replace(run.metrics_file)  # what --resume's truncate_metrics_after does
    assert [r["step"] for r in reader.metrics()[0]] == [1]


def test_a_stale_heartbeat_or_a_dead_pid_is_crashed(tmp_path: Path) -> None:
    run = RunWriter(tmp_path / "r", "train").start()
    run.heartbeat._stop.set()  # type: ignore[union-attr]  # the writer dies without a word
    beat = json.loads(run.heartbeat_file.read_text())
    reader = RunReader(tmp_path / "r")
    assert reader.status()[0] == "running"
    assert reader.status(now=beat["time"] + STALE_AFTER_S + 1)[0] == "crashed"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    beat["pid"] = int(dead.stdout)
    run.heartbeat_file.write_text(json.dumps(beat))
    status, why = reader.status()
    assert status == "crashed" and str(beat["pid"]) in (why or "")


def test_the_heartbeat_beats_while_the_run_lives(tmp_path: Path) -> None:
    run = RunWriter(tmp_path / "r", "eval")
    run.start(max_steps=4)
    run.heartbeat.interval = 0.05  # type: ignore[union-attr]
    run.heartbeat._stop.set()  # type: ignore[union-attr]  # restart the thread at the short interval
    run.heartbeat._thread.join()  # type: ignore[union-attr]
    run.heartbeat.start()  # type: ignore[union-attr]
    run.set_step(3)
    first = json.loads(run.heartbeat_file.read_text())["time"]
    time.sleep(0.3)
    beat = json.loads(run.heartbeat_file.read_text())
    assert beat["time"] > first and beat["step"] == 3 and beat["max_steps"] == 4 and beat["status"] == "running"
    run.stop("boom")
    assert RunReader(tmp_path / "r").status() == ("failed", "boom")


def test_summaries_fall_back_to_the_file_where_the_sidecar_is_missing_or_short(tmp_path: Path) -> None:
    path = tmp_path / "r" / "episodes" / "step_1.jsonl"
    eps = [_episode(i) for i in range(6)]
    write_episodes(path, eps)
    (tmp_path / "r" / "metrics.jsonl").write_text("")
    full = RunReader(tmp_path / "r").summaries("step_1")
    assert [s["index"] for s in full] == list(range(6)) and full[0]["preview"].startswith("answer number 0 with")
    assert len(full[0]["preview"]) == 200 and full[1]["reward"] == 1.0 and full[1]["is_correct"] is True
    sidecar = index_path(path)
    lines = sidecar.read_text().splitlines(keepends=True)
    sidecar.write_text("".join(lines[:2]))  # a sidecar behind its file (another writer, an old version)
    assert RunReader(tmp_path / "r").summaries("step_1") == full
    sidecar.unlink()
    reader = RunReader(tmp_path / "r")
    assert reader.summaries("step_1") == full
    assert Episode.model_validate(reader.episode("step_1", 4)) == eps[4]
    sidecar.write_text("not json\n")  # a damaged sidecar is ignored, not trusted
    assert RunReader(tmp_path / "r").summaries("step_1") == full


def test_an_eval_appending_episodes_is_followed_with_partial_lines_counted(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    writer = EpisodeWriter(tmp_path / "e" / "episodes.jsonl")
    reader = RunReader(tmp_path / "e")
    assert reader.files() == [{"name": "eval", "kind": "eval", "step": None, "episodes": 0}]
    for i in range(3):
        writer.write(_episode(i, reason="correct" if i else "no_answer_extracted"))
    assert [s["reason"] for s in reader.summaries("eval")] == ["no_answer_extracted", "correct", "correct"]
    with open(tmp_path / "e" / "episodes.jsonl", "ab") as f:  # another writer, half-way through a line
        f.write(_episode(9).model_dump_json()[:50].encode())
    assert len(reader.summaries("eval")) == 3 and reader.partial_lines("eval") == 1
    assert reader.episode("eval", 2)["task"]["id"] == "t2"
    with pytest.raises(RunReadError, match="has 3 episodes; index 3 is out of range"):
        reader.episode("eval", 3)
    with pytest.raises(RunReadError, match=r"no episodes file 'step_9'; it has \['eval'\]"):
        reader.summaries("step_9")
    writer.close()


def test_find_runs_and_what_a_non_run_is_told(tmp_path: Path) -> None:
    RunWriter(tmp_path / "a" / "train1", "train").start().stop()
    (tmp_path / "a" / "train1" / "checkpoints" / "step_1").mkdir(parents=True)
    (tmp_path / "a" / "train1" / "checkpoints" / "step_1" / "metrics.jsonl").write_text("")  # not a run of its own
    (tmp_path / "b" / "old_eval").mkdir(parents=True)
    (tmp_path / "b" / "old_eval" / "summary.json").write_text(json.dumps({"benchmark": "gsm8k", "model": "m"}))
    (tmp_path / "b" / "old_eval" / "episodes.jsonl").write_text("")
    (tmp_path / "c" / "old_train" / "checkpoints").mkdir(parents=True)
    (tmp_path / "c" / "old_train" / "config.yaml").write_text("benchmark: yesno\nmax_steps: 5\n")
    (tmp_path / "c" / "old_train" / "metrics.jsonl").write_text('{"kind": "train", "step": 5}\n')
    (tmp_path / "d" / ".hidden" / "x").mkdir(parents=True)
    (tmp_path / "d" / ".hidden" / "x" / "run.json").write_text("{}")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.yaml").write_text("a: 1\n")  # a config alone is not a run
    assert find_runs(tmp_path) == [tmp_path / "a" / "train1", tmp_path / "b" / "old_eval",
                                   tmp_path / "c" / "old_train"]
    old = time.time() - 3600
    for p in (tmp_path / "c" / "old_train" / "metrics.jsonl", tmp_path / "b" / "old_eval" / "episodes.jsonl"):
        os.utime(p, (old, old))
    info = RunReader(tmp_path / "c" / "old_train").info()  # no run.json, no heartbeat: an older rllm's run
    assert (info.kind, info.status, info.step, info.max_steps, info.benchmark) == ("train", "finished", 5, 5,
                                                                                   "yesno")
    ev = RunReader(tmp_path / "b" / "old_eval").info()
    assert (ev.kind, ev.status, ev.benchmark, ev.model) == ("eval", "finished", "gsm8k", "m")
    reader = RunReader(tmp_path / "e")
    assert not reader.is_run()
    with pytest.raises(NotARunError, match=r"is not an rllm run: a run directory holds run\.json"):
        reader.info()
    with pytest.raises(NotARunError, match="does not exist"):
        RunReader(tmp_path / "nope").info()


def test_log_tail_reads_the_last_lines(tmp_path: Path) -> None:
    import logging

    run = RunWriter(tmp_path / "r", "train").start()
    logging.getLogger("rllm.test").warning("a warning from rllm")
    for i in range(5000):
        run.echo(f"line {i}")
    run.stop()
    tail = RunReader(tmp_path / "r").log_tail(3)
    assert [t.split(" ", 2)[2] for t in tail] == ["line 4997", "line 4998", "line 4999"]
    text = (tmp_path / "r" / "log.txt").read_text()
    assert "WARNING rllm.test: a warning from rllm" in text
    logging.getLogger("rllm.test").warning("after the run")  # the handler is gone with the run
    assert "after the run" not in (tmp_path / "r" / "log.txt").read_text()
