"""The rollout executor seam: one method, two implementations, a double; the loop and eval run through it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm_core.errors import TrainingError
from rllm_rollout.executor import EpisodeBatch, LocalExecutor, RayExecutor, RolloutExecutor, open_executor
from rllm_rollout.rollout import rollout
from rllm_testing.executor import SequentialExecutor
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder, yesno_config
from rllm_train.loop import train


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(alternating_responder()) as up:
        yield up


def test_every_executor_satisfies_the_protocol() -> None:
    assert isinstance(LocalExecutor(), RolloutExecutor) and isinstance(SequentialExecutor(), RolloutExecutor)
    assert "run" in RayExecutor.__dict__ and isinstance(RayExecutor.__dict__["gateway_host"], property)
    with open_executor(0) as executor:  # no workers: this process, no Ray
        assert isinstance(executor, LocalExecutor) and executor.gateway_host == "127.0.0.1"


def test_the_local_executor_runs_a_batch_in_task_order(upstream: FakeUpstream) -> None:
    @rollout
    async def echo(task, config):
        return {"answer": task["question"]}

    tasks = YesNoBenchmark(n_train=3).load("train")
    batch = EpisodeBatch(echo, tasks, model="m", base_url=upstream.base_url, attempts=2, concurrency=4)
    episodes = asyncio.run(LocalExecutor().run(batch))
    assert [ep.task.id for ep in episodes] == [t.id for t in tasks for _ in range(2)]


def test_the_training_loop_runs_its_episodes_through_the_executor_it_is_given(tmp_path: Path,
                                                                            upstream: FakeUpstream) -> None:
    executor = SequentialExecutor()
    config = yesno_config(tmp_path, max_steps=2)
    result = train(config, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(),
                   progress=False, executor=executor)
    assert result.steps_done == 2
    train_batches = [b for b in executor.batches if ":train:" in b.tasks[0].id]
    validation = [b for b in executor.batches if ":test:" in b.tasks[0].id]
    assert [(len(b.tasks), b.attempts) for b in train_batches] == [(config.batch_size, config.group_size)] * 2
    assert validation and all(b.attempts == 1 for b in validation)
    assert all(b.gateway is not None for b in executor.batches)  # the run's gateway, in front of the policy


def test_an_executor_that_fails_fails_the_step_with_its_error(tmp_path: Path, upstream: FakeUpstream) -> None:
    config = yesno_config(tmp_path, max_steps=2, eval_examples=0)
    with pytest.raises((TrainingError, RuntimeError), match="fails as asked"):
        train(config, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), progress=False,
              executor=SequentialExecutor(fail_on_batch=1))
