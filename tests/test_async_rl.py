"""Asynchronous RL (`--max-staleness K`): rollouts of the next K steps run while a step trains; no row more than K
policy versions old reaches the update (stale ones dropped and counted); a resume neither loses nor repeats an
episode; a backend that cannot serve while it trains refuses by name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm_core.errors import ConfigError
from rllm_core.types import Episode, Step, Trajectory, TrajectoryGroup
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder, yesno_config
from rllm_train.backend import BackendCapabilities
from rllm_train.loop import sample_tasks, train
from rllm_train.pipeline import RolloutPipeline, drop_stale, oldest_version
from rllm_train.rundir import RunDir

ASYNC = BackendCapabilities(async_rollouts=True)


def versioned_backend(upstream: FakeUpstream, **kwargs: object) -> RecordingBackend:
    """The recording backend whose sync makes the fake upstream report the new version (as a real server does)."""
    return RecordingBackend(upstream.base_url, caps=ASYNC, upstream=upstream, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(alternating_responder(), delay_s=0.05) as up:
        yield up


def test_the_next_steps_rollouts_run_while_a_step_trains(tmp_path: Path, upstream: FakeUpstream) -> None:
    backend = versioned_backend(upstream, step_delay_s=0.3)
    result = train(yesno_config(tmp_path, max_staleness=1, eval_examples=0, max_steps=4), backend=backend,
                   benchmark=YesNoBenchmark(), progress=False)
    assert result.steps_done == 4
    events = backend.events
    first_update_done = events.index("train_done")
    assert [i for i, e in enumerate(events) if e == "before_rollouts"][1] < first_update_done  # step 2 overlapped
    for rows, version in zip(backend.batches, backend.trained_at, strict=True):
        assert rows and all(version - r.policy_version <= 1 for r in rows if r.policy_version is not None)
    records = [m for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"]
    assert all(m["async/stale_dropped"] == 0 and m["async/staleness_max"] <= 1 for m in records)
    assert max(m["async/staleness_max"] for m in records) == 1  # episodes really were one version behind


def test_rows_older_than_k_are_dropped_and_counted(tmp_path: Path, upstream: FakeUpstream) -> None:
    backend = RecordingBackend(upstream.base_url, caps=ASYNC)  # the upstream keeps reporting version 0
    result = train(yesno_config(tmp_path, max_staleness=1, eval_examples=0, max_steps=3), backend=backend,
                   benchmark=YesNoBenchmark(), progress=False)
    records = {m["step"]: m for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"}
    assert records[1]["async/stale_dropped"] == 0 and records[2]["async/stale_dropped"] == 0
    assert records[3]["async/stale_dropped"] == 4 and "skipped" in records[3]  # version 0 at trainer version 2
    saved = (result.run_dir / "episodes" / "step_3.jsonl").read_text().splitlines()
    assert len(saved) == 4 and all(json.loads(line)["trajectories"] for line in saved)  # recorded, not trained
    assert len(backend.batches) == 2


def test_an_async_resume_runs_each_step_once_on_the_tasks_of_that_step(tmp_path: Path,
                                                                        upstream: FakeUpstream) -> None:
    bench = YesNoBenchmark(n_train=5)
    train(yesno_config(tmp_path, max_steps=2, eval_examples=0, max_staleness=2), benchmark=bench,
          backend=versioned_backend(upstream), progress=False)  # step 3 and 4's episodes were started, then cancelled
    assert not (tmp_path / "run" / "episodes" / "step_3.jsonl").exists()
    resumed = versioned_backend(upstream)
    result = train(yesno_config(tmp_path, max_steps=4, eval_examples=0, max_staleness=2), benchmark=bench,
                   backend=resumed, resume=True, progress=False)
    assert result.steps_done == 4 and resumed.steps_done == 4
    tasks = bench.load("train")
    for step in (3, 4):
        lines = (result.run_dir / "episodes" / f"step_{step}.jsonl").read_text().splitlines()
        assert len(lines) == 4  # batch 2 × group 2: none lost, none twice
        assert sorted({json.loads(line)["task"]["id"] for line in lines}) == \
            sorted({t.id for t in sample_tasks(tasks, 2, 0, step)})


def test_a_backend_that_cannot_serve_while_training_refuses_by_name(tmp_path: Path,
                                                                     upstream: FakeUpstream) -> None:
    with pytest.raises(ConfigError, match=r"--max-staleness 1 \(supported: 0"):
        train(yesno_config(tmp_path, max_staleness=1), backend=RecordingBackend(upstream.base_url),
              benchmark=YesNoBenchmark(), progress=False)


def test_the_pipeline_starts_k_steps_ahead_and_cancels_what_will_not_train() -> None:
    started: list[int] = []
    cancelled: list[int] = []

    async def rollouts(step: int) -> list[Episode]:
        started.append(step)
        try:
            await asyncio.sleep(0.01 if step <= 2 else 10)
        except asyncio.CancelledError:
            cancelled.append(step)
            raise
        return []

    async def run() -> None:
        pipeline = RolloutPipeline(rollouts, max_staleness=2, last_step=4)
        await pipeline.episodes(1)
        await asyncio.sleep(0)  # the started tasks take their first step
        assert started == [1, 2, 3]  # steps 2 and 3 run while step 1 trains
        await pipeline.episodes(2)
        await asyncio.sleep(0)
        assert started == [1, 2, 3, 4]  # never past the last step
        await pipeline.close()

    asyncio.run(run())
    assert sorted(cancelled) == [3, 4]


def test_staleness_is_the_oldest_token_version() -> None:
    def step(versions: list[int]) -> Step:
        return Step(prompt_token_ids=[1], completion_token_ids=[2] * len(versions), token_policy_versions=versions,
                    token_source="server", policy_version=versions[-1])

    fresh, spanning = Trajectory(steps=[step([3, 3])]), Trajectory(steps=[step([1, 2]), step([3])])
    assert oldest_version(spanning.steps) == 1  # an episode that spans a swap: its oldest token counts
    groups = [TrajectoryGroup(group_id="g", task_id="t", role="r", trajectories=[fresh, spanning]),
              TrajectoryGroup(group_id="h", task_id="u", role="r", trajectories=[spanning])]
    kept, metrics = drop_stale(groups, trainer_version=3, max_staleness=1)
    assert [g.trajectories for g in kept] == [[fresh]] and metrics["async/stale_dropped"] == 2
    assert metrics["async/staleness_max"] == 0 and len(groups[0].trajectories) == 2  # the input is left whole


def test_stale_rows_mask_keeps_the_trajectory_and_trains_only_its_fresh_tokens() -> None:
    """--stale-rows mask: a partial rollout that spans a swap keeps its row; tokens older than the trainer's
    version − K are in it untrained; a row left with no fresh token is dropped and counted."""
    from rllm_train.packing import pack_trajectory
    from rllm_train.pipeline import min_trained_version

    spanning = Trajectory(steps=[Step(prompt_token_ids=[1, 2], completion_token_ids=[3, 4, 5],
                                      logprobs=[-0.1, -0.2, -0.3], token_policy_versions=[1, 1, 2],
                                      token_source="server", policy_version=2)])
    groups = [TrajectoryGroup(group_id="g", task_id="t", role="r", trajectories=[spanning])]
    kept, metrics = drop_stale(groups, trainer_version=3, max_staleness=1, rule="mask")
    assert kept == groups and metrics["async/stale_dropped"] == 0 and metrics["async/staleness_hist/2"] == 1
    floor = min_trained_version(3, 1, "mask")
    assert floor == 2 and min_trained_version(3, 1, "drop") is None and min_trained_version(3, 0, "mask") is None
    (row,), counts = pack_trajectory(spanning, 1.0, min_version=floor)
    assert row.tokens == [1, 2, 3, 4, 5] and row.loss_mask == [0, 0, 0, 0, 1]
    assert row.sampling_logprobs == [0.0, 0.0, 0.0, 0.0, -0.3] and row.advantages == [0, 0, 0, 0, 1.0]
    assert row.policy_version == 2 and counts["stale_tokens_masked"] == 2
    rows, counts = pack_trajectory(spanning, 1.0, min_version=3)
    assert rows == [] and counts["rows_dropped_stale"] == 1 and counts["stale_tokens_masked"] == 3


def test_stale_rows_mask_in_a_run_counts_masked_tokens_instead_of_dropped_rows(tmp_path: Path,
                                                                              upstream: FakeUpstream) -> None:
    backend = RecordingBackend(upstream.base_url, caps=ASYNC)  # the upstream keeps reporting version 0
    result = train(yesno_config(tmp_path, max_staleness=1, stale_rows="mask", eval_examples=0, max_steps=3),
                   backend=backend, benchmark=YesNoBenchmark(), progress=False)
    records = {m["step"]: m for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"}
    assert records[3]["async/stale_dropped"] == 0 and records[3]["async/staleness_hist/2"] == 4
    assert records[3]["pack/stale_tokens_masked"] > 0 and records[3]["pack/rows_dropped_stale"] == 4
    assert records[2]["pack/stale_tokens_masked"] == 0


def test_async_local_training_splits_the_cores_between_server_and_trainer() -> None:
    from rllm_backends.local_torch.options import LocalOptions, thread_budgets

    assert thread_budgets(LocalOptions(), asynchronous=False, cores=2) == (None, None)  # each takes every core
    assert thread_budgets(LocalOptions(), asynchronous=True, cores=2) == (1, 1)
    assert thread_budgets(LocalOptions(), asynchronous=True, cores=16) == (8, 8)
    assert thread_budgets(LocalOptions(), asynchronous=True, cores=1) == (1, 1)
    assert thread_budgets(LocalOptions(server_threads=3), asynchronous=True, cores=16) == (3, 13)
    assert thread_budgets(LocalOptions(trainer_threads=2), asynchronous=False, cores=16) == (None, 2)


def test_async_on_the_local_backend_samples_while_the_trainer_updates_on_its_own_threads(tmp_path: Path) -> None:
    """The real engine and trainer (tiny-random) at K = 1: the server and the trainer split the cores, every
    step trains, nothing is older than one version, and --resume continues asynchronously."""
    from rich.console import Console

    from rllm_train.config import TrainConfig

    def config(steps: int) -> TrainConfig:
        return TrainConfig(model="tiny-random", benchmark="yesno", batch_size=2, group_size=2, max_tokens=4,
                           max_steps=steps, eval_examples=0, max_staleness=1, output=str(tmp_path / "run"),
                           backend_options={"server_threads": 1, "trainer_threads": 1})

    train(config(2), benchmark=YesNoBenchmark(), progress=False, console=Console(quiet=True))
    result = train(config(3), benchmark=YesNoBenchmark(), progress=False, console=Console(quiet=True), resume=True)
    records = [m for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"]
    assert [m["policy_version"] for m in records] == [1, 2, 3]
    assert all(m["async/server_threads"] == 1 and m["async/trainer_threads"] == 1 for m in records)
    assert all(m["async/stale_dropped"] == 0 and m["async/staleness_max"] <= 1 for m in records)
    calls = [s for line in (result.run_dir / "episodes" / "step_2.jsonl").open()
             for t in json.loads(line)["trajectories"] for s in t["steps"]]
    assert calls and min(s["started_at"] for s in calls) < records[0]["time"]  # sampled while step 1 trained
