"""The example users copy: `return rllm.Episode(artifacts={"answer": ...})` inside `@rllm.rollout`, written
exactly as they write it. An Episode built inside a rollout gets the rollout's task, id and attempt; one built
anywhere else must be given its task, and the error says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from pydantic import ValidationError

import rllm
from rllm_core.io import read_jsonl, write_jsonl
from rllm_envs.benchmarks import get_benchmark
from rllm_rollout.engine import run_episodes
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream


@rllm.rollout
def solve(task, config):  # exactly as users write it (untyped)
    client = OpenAI(base_url=config.base_url, api_key=config.api_key)
    r = client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": task.instruction}])
    text = r.choices[0].message.content
    return rllm.Episode(artifacts={"answer": text})


@rllm.rollout
async def solve_async(task: rllm.Task, config: rllm.RolloutConfig) -> rllm.Episode:
    client = AsyncOpenAI(base_url=config.base_url, api_key=config.api_key)
    r = await client.chat.completions.create(model=config.model,
                                             messages=[{"role": "user", "content": task.instruction}])
    return rllm.Episode(artifacts={"answer": r.choices[0].message.content}, reward=1.0)


@pytest.fixture
def up() -> Any:
    with start_fake_upstream(lambda body: "5") as upstream:
        yield upstream


def test_the_seed_example_runs(up: FakeUpstream, tmp_path: Path) -> None:
    task = rllm.Task(id="t1", instruction="What is 2 + 3?")
    episode = solve.run(task, base_url=up.base_url, model="fake")
    assert episode.error is None and episode.termination_reason == "completed"
    assert episode.task == task and episode.artifacts == {"answer": "5"} and episode.rollout == "solve"
    step = episode.trajectories[0].steps[0]  # the captured call fills the episode it returned
    assert step.trainable and step.text == "5"
    write_jsonl(tmp_path / "episodes.jsonl", [episode])  # and it round-trips exactly
    (back,) = read_jsonl(tmp_path / "episodes.jsonl")
    assert back == episode and back.task.id == "t1"
    assert rllm.group_trajectories([back])[0].task_id == "t1"


async def test_id_and_attempt_come_from_the_rollout(up: FakeUpstream) -> None:
    task = rllm.Task(id="t2", instruction="What is 2 + 3?")
    episode = await solve_async.arun(task, base_url=up.base_url, session_id="episode-7", attempt=3)
    assert (episode.id, episode.attempt, episode.task.id, episode.reward) == ("episode-7", 3, "t2", 1.0)
    sync_episode = await solve.arun(task, base_url=up.base_url, session_id="episode-8", attempt=1)
    assert (sync_episode.id, sync_episode.attempt) == ("episode-8", 1)  # the agent's worker thread sees it too


async def test_engine_scores_it_like_any_rollout(up: FakeUpstream) -> None:
    bench = get_benchmark("arithmetic")
    tasks = bench.load("test", max_examples=2)
    episodes = await run_episodes(solve, tasks, base_url=up.base_url, attempts=2, benchmark=bench, progress=False)
    assert [(e.task.id, e.attempt) for e in episodes] == [(t.id, a) for t in tasks for a in range(2)]
    assert len({e.id for e in episodes}) == 4 and all(e.reward_reason is not None for e in episodes)


async def test_concurrent_rollouts_keep_their_own_task(up: FakeUpstream) -> None:
    tasks = [rllm.Task(id=f"c{i}", instruction="What is 2 + 3?") for i in range(6)]
    episodes = await asyncio.gather(*(solve.arun(t, base_url=up.base_url) for t in tasks))
    assert [e.task.id for e in episodes] == [t.id for t in tasks]


def test_given_fields_win_inside_a_rollout(up: FakeUpstream) -> None:
    other = rllm.Task(id="other")

    @rllm.rollout
    def explicit(task: rllm.Task, config: rllm.RolloutConfig) -> rllm.Episode:
        return rllm.Episode(task=other, id="mine", artifacts={"answer": "x"})

    episode = explicit.run(rllm.Task(id="t3"), base_url=up.base_url)
    assert (episode.task.id, episode.id) == ("other", "mine")


def test_a_standalone_episode_still_needs_its_task() -> None:
    with pytest.raises(ValidationError, match=r"needs its task: pass Episode\(task=\.\.\.\), or build it inside "
                                              r"an @rllm.rollout function"):
        rllm.Episode(artifacts={"answer": "5"})
    with pytest.raises(ValidationError, match="needs its task"):
        rllm.Episode.model_validate_json('{"id": "e", "artifacts": {}}')
    assert rllm.Episode(task=rllm.Task(id="t")).task.id == "t"
