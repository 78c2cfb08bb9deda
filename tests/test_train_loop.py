"""The training loop end to end against the fake upstream and the recording backend: run directory,
metrics, checkpoints, resume (also after SIGKILL), skipped steps, and the errors for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm_core.errors import ConfigError, TrainingError
from rllm_core.runs.checkpoints import latest_checkpoint
from rllm_rollout.rollout import rollout
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder, yesno_config
from rllm_train.config import TrainConfig, load_config
from rllm_train.loop import sample_tasks, train
from rllm_train.rundir import RunDir


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(alternating_responder()) as up:
        yield up


_config = yesno_config


def test_loop_writes_the_run_directory(tmp_path: Path, upstream: FakeUpstream) -> None:
    backend = RecordingBackend(upstream.base_url)
    result = train(_config(tmp_path), backend=backend, benchmark=YesNoBenchmark(), progress=False)
    run = RunDir(result.run_dir)
    assert result.steps_done == 3 and backend.closed
    assert load_config(run.config_file).max_steps == 3
    records = run.read_metrics()
    assert [(m["kind"], m["step"]) for m in records] == [("eval", 0), ("train", 1), ("train", 2), ("train", 3),
                                                         ("eval", 3)]
    step1 = records[1]
    assert step1["reward/mean"] == pytest.approx(0.5) and step1["reward/accuracy"] == pytest.approx(0.5)
    assert step1["reason/correct"] == pytest.approx(0.5) and step1["reason/wrong_answer"] == pytest.approx(0.5)
    assert step1["groups/total"] == 2 and step1["policy_version"] == 1
    assert {"time/rollout_s", "time/train_s", "time/sync_s", "time/step_s", "pack/rows"} <= set(step1)
    # each group is one yes (+1) and one no (−1): GRPO advantages on the trained tokens
    advs = sorted({a for r in backend.batches[0] for a, m in zip(r.advantages, r.loss_mask, strict=True) if m})
    assert advs == pytest.approx([-1 / (2**0.5 * 0.5 + 1e-6) * 0.5, 0.5 / (2**0.5 * 0.5 + 1e-6)], abs=1e-4)
    assert len(list((run.episodes_dir).glob("step_*.jsonl"))) == 3
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["latest", "step_2", "step_3"]
    assert latest_checkpoint(run.checkpoints_dir) == run.checkpoints_dir / "step_3"


def test_resume_continues_the_same_task_sequence(tmp_path: Path, upstream: FakeUpstream) -> None:
    bench = YesNoBenchmark(n_train=5)
    train(_config(tmp_path, max_steps=2, eval_examples=0), backend=RecordingBackend(upstream.base_url),
          benchmark=bench, progress=False)
    resumed = RecordingBackend(upstream.base_url)
    result = train(_config(tmp_path, max_steps=4, eval_examples=0), backend=resumed, benchmark=bench,
                   resume=True, progress=False)
    assert resumed.steps_done == 4 and result.steps_done == 4
    assert [m["step"] for m in RunDir(result.run_dir).read_metrics()] == [1, 2, 3, 4]
    tasks = bench.load("train")
    expected = [t.id for t in sample_tasks(tasks, 2, 0, 3)]
    got = [json.loads(line)["task"]["id"] for line in (result.run_dir / "episodes" / "step_3.jsonl").open()]
    assert sorted(set(got)) == sorted(set(expected))


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path, upstream: FakeUpstream) -> None:
    with pytest.raises(TrainingError, match=r"stopped at step 3: .*NaN.* last good checkpoint is .*step_2"):
        train(_config(tmp_path, max_steps=5, save_every=1, eval_examples=0),
              backend=RecordingBackend(upstream.base_url, fail_at_step=3), benchmark=YesNoBenchmark(),
              progress=False)
    assert latest_checkpoint(tmp_path / "run" / "checkpoints") == tmp_path / "run" / "checkpoints" / "step_2"


def test_a_failed_step_checkpoints_the_last_finished_step_for_resume(tmp_path: Path, upstream: FakeUpstream) -> None:
    """save_every 10, failure at step 3: steps 1-2 are not lost, a rescue checkpoint holds step 2."""
    with pytest.raises(TrainingError, match=r"stopped at step 3: .* last good checkpoint is .*step_2"):
        train(_config(tmp_path, max_steps=5, save_every=10, eval_examples=0),
              backend=RecordingBackend(upstream.base_url, fail_at_step=3), benchmark=YesNoBenchmark(),
              progress=False)
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert ckpt == tmp_path / "run" / "checkpoints" / "step_2"
    resumed = RecordingBackend(upstream.base_url)
    result = train(_config(tmp_path, max_steps=4, save_every=10, eval_examples=0), backend=resumed,
                   benchmark=YesNoBenchmark(), resume=True, progress=False)
    assert resumed.steps_done == 4 and result.steps_done == 4


class _FailingSync(RecordingBackend):
    def sync_weights(self) -> int:
        if self.steps_done == 2:
            raise TrainingError("the engines did not take the weights")
        return super().sync_weights()


def test_a_failed_sync_after_an_update_writes_no_rescue_checkpoint(tmp_path: Path, upstream: FakeUpstream) -> None:
    """The update of step 2 moved the weights but the step never finished: saving them as step 1 would lie."""
    with pytest.raises(TrainingError, match="no checkpoint was written yet"):
        train(_config(tmp_path, max_steps=5, save_every=10, eval_examples=0),
              backend=_FailingSync(upstream.base_url), benchmark=YesNoBenchmark(), progress=False)
    assert latest_checkpoint(tmp_path / "run" / "checkpoints") is None


def test_step_without_trainable_calls_is_skipped_with_reason(tmp_path: Path, upstream: FakeUpstream) -> None:
    @rollout
    def no_llm(task: object, config: object) -> str:
        return "yes"

    backend = RecordingBackend(upstream.base_url)
    result = train(_config(tmp_path, max_steps=1, eval_examples=0), backend=backend, benchmark=YesNoBenchmark(),
                   rollout=no_llm, progress=False)
    assert backend.batches == []
    assert "no LLM calls were recorded" in result.history[0]["skipped"]


def test_time_budget_stops_with_a_checkpoint(tmp_path: Path, upstream: FakeUpstream) -> None:
    result = train(_config(tmp_path, max_steps=50, save_every=10, eval_examples=0, max_minutes=1e-6),
                   backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), progress=False)
    assert result.steps_done == 1 and result.last_checkpoint == tmp_path / "run" / "checkpoints" / "step_1"


def test_group_rejection_skips_flat_groups(tmp_path: Path) -> None:
    with start_fake_upstream(lambda body: "yes") as up:  # every answer right: every group too easy
        result = train(_config(tmp_path, max_steps=1, eval_examples=0, rejection="group"),
                       backend=RecordingBackend(up.base_url), benchmark=YesNoBenchmark(), progress=False)
    m = result.history[0]
    assert m["groups/frac_too_easy"] == 1.0 and "rejection sampling dropped every group" in m["skipped"]


def test_bad_input_is_reported_clearly(tmp_path: Path, upstream: FakeUpstream) -> None:
    with pytest.raises(ConfigError, match=r"group_size=1.*--group-size 2 or more"):
        load_config(None, group_size=1, algo="grpo")
    assert load_config(None, group_size=1, algo="reinforce").group_size == 1
    with pytest.raises(ConfigError, match="lr"):
        load_config(None, lr=-1)
    bad = tmp_path / "train.yaml"
    bad.write_text("group_size: 4\nunknown_option: 1\n")
    with pytest.raises(ConfigError, match="unknown_option"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no reward function"):
        train(_config(tmp_path), backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(reward=""),
              progress=False)
    with pytest.raises(ConfigError, match=r"must look like 'package\.module:function'"):
        train(_config(tmp_path, agent="nocolon"), backend=RecordingBackend(upstream.base_url),
              benchmark=YesNoBenchmark(), progress=False)


def test_toml_config_and_role_map(tmp_path: Path) -> None:
    f = tmp_path / "train.toml"
    f.write_text('benchmark = "gsm8k"\ngroup-size = 8\n[algo]\nsolver = "grpo"\njudge = "reinforce"\n')
    cfg = load_config(f, lr=1e-5)
    assert cfg.group_size == 8 and cfg.algo == {"solver": "grpo", "judge": "reinforce"} and cfg.lr == 1e-5


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rllm_testing.recording_backend import RecordingBackend
    from rllm_testing.fake_upstream import start_fake_upstream
    from rllm_train.config import TrainConfig
    from rllm_train.loop import train
    from rllm_testing.training import YesNoBenchmark, alternating_responder

    out, phase = Path(sys.argv[1]), sys.argv[2]

    class Hanging(RecordingBackend):
        def train_step(self, rows):
            if phase == "train" and self.steps_done == 2:
                (out / "hanging").write_text("train"); time.sleep(120)
            return super().train_step(rows)
        def save(self, path):
            if phase == "save" and self.steps_done == 3:
                (Path(path) / "half-written.bin").write_bytes(b"x" * 1000)
                (out / "hanging").write_text("save"); time.sleep(120)
            super().save(path)

    with start_fake_upstream(alternating_responder()) as up:
        cfg = TrainConfig(benchmark="yesno", batch_size=2, group_size=2, max_steps=6, save_every=1,
                          eval_examples=0, output=str(out / "run"), max_tokens=8)
        train(cfg, backend=Hanging(up.base_url), benchmark=YesNoBenchmark(), progress=False)
""")


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["train", "save"])
def test_sigkill_mid_step_resumes_from_last_good_checkpoint(tmp_path: Path, phase: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), phase], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 90
        while not (tmp_path / "hanging").exists():
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.time() < deadline, "child never reached the hanging point"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpts = tmp_path / "run" / "checkpoints"
    # "train" hangs inside step 3's update, "save" while writing step 3's checkpoint: step 2 is the last good one
    assert latest_checkpoint(ckpts) == ckpts / "step_2"
    if phase == "save":
        assert list(ckpts.glob(".tmp-step_3-*")), "the half-written checkpoint should be a temp dir"
    with start_fake_upstream(alternating_responder()) as up:
        backend = RecordingBackend(up.base_url)
        cfg = TrainConfig(benchmark="yesno", batch_size=2, group_size=2, max_steps=4, save_every=1,
                          eval_examples=0, output=str(tmp_path / "run"), max_tokens=8)
        result = train(cfg, backend=backend, benchmark=YesNoBenchmark(), resume=True, progress=False)
    assert backend.steps_done == 4 and result.steps_done == 4
    assert not list(ckpts.glob(".tmp-*"))
    assert [m["step"] for m in RunDir(tmp_path / "run").read_metrics()] == [1, 2, 3, 4]


def test_self_scoring_agent_without_a_reward_is_reported_once(monkeypatch, caplog) -> None:
    import rllm_train.rollouts as loop
    from rllm_core.types import Episode, Task

    monkeypatch.setattr(loop, "_warned_no_reward", False)
    task = Task(id="t", instruction="q")
    episodes = [Episode(id="a", task=task, artifacts={"reward": 1}), Episode(id="b", task=task)]
    with caplog.at_level("WARNING", logger="rllm.train"):
        loop._self_scored(episodes)
        loop._self_scored([Episode(id="c", task=task)])  # said once per process, not once per step
    assert [e.reward for e in episodes] == [1.0, 0.0]
    assert [e.reward_reason for e in episodes] == ["agent_reward", "no_reward"]
    warned = [r.getMessage() for r in caplog.records if "set no reward" in r.getMessage()]
    assert warned == ["--workflow none: 1 of 2 episodes set no reward (Episode.reward or artifacts['reward']); "
                      "they count as 0 (metrics: reason/no_reward)"]
