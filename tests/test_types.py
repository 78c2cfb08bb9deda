"""Types: invariants hold, JSONL and Parquet round-trip exactly, grouping by task and role."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from rllm_core.io import read_jsonl, read_parquet, write_jsonl, write_parquet
from rllm_core.types import Episode, Step, Task, Trajectory, group_trajectories


def _step(**kw) -> Step:
    base = dict(prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], logprobs=[-0.1, -0.2],
                token_source="server", text="hi")
    base.update(kw)
    return Step(**base)


def test_one_logprob_per_completion_token() -> None:
    with pytest.raises(ValidationError, match="2 completion tokens but 1 logprobs"):
        _step(logprobs=[-0.1])


def test_token_ids_are_not_negative() -> None:
    with pytest.raises(ValidationError, match="completion_token_ids contains a negative id"):
        _step(completion_token_ids=[4, -1])
    with pytest.raises(ValidationError, match="prompt_token_ids contains a negative id"):
        _step(prompt_token_ids=[-5])


def test_server_tokens_need_ids() -> None:
    with pytest.raises(ValidationError, match="needs prompt_token_ids"):
        Step(token_source="server", completion_token_ids=[1])
    with pytest.raises(ValidationError, match="logprobs given without"):
        Step(logprobs=[-1.0])


def test_trainable() -> None:
    assert _step().trainable
    assert not _step(error="boom").trainable
    assert not Step(text="no ids").trainable
    assert not _step(logprobs=None).trainable


def test_unknown_fields_rejected() -> None:
    with pytest.raises(ValidationError):
        Step(not_a_field=1)


def _episode() -> Episode:
    task = Task(id="t1", instruction="What is 2 + 3?", ground_truth="5", metadata={"level": 1})
    steps = [_step(agent="solver", logprobs=[-0.1234567890123, -1e-12]), _step(agent="solver", text="again")]
    return Episode(task=task, trajectories=[Trajectory(name="solver", steps=steps, reward=1.0)],
                   artifacts={"answer": "5", "nested": {"a": [1, 2.5]}}, reward=1.0, is_correct=True,
                   termination_reason="completed", metrics={"wall_s": 0.25})


def test_jsonl_round_trip_exact(tmp_path) -> None:
    eps = [_episode(), _episode()]
    path = tmp_path / "episodes.jsonl"
    assert write_jsonl(path, eps) == 2
    back = read_jsonl(path)
    assert back == eps
    assert back[0].trajectories[0].steps[0].logprobs == [-0.1234567890123, -1e-12]
    # byte-for-byte stable on a second write
    path2 = tmp_path / "again.jsonl"
    write_jsonl(path2, back)
    assert path.read_bytes() == path2.read_bytes()


def test_jsonl_bad_line_says_where(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_episode().model_dump_json() + "\n" + json.dumps({"task": 3}) + "\n")
    with pytest.raises(Exception, match=r"bad.jsonl:2 is not a valid Episode"):
        read_jsonl(path)


def test_parquet_round_trip(tmp_path) -> None:
    eps = [_episode()]
    write_parquet(tmp_path / "e.parquet", eps)
    assert read_parquet(tmp_path / "e.parquet") == eps


def test_group_trajectories_by_task_and_role() -> None:
    def ep(task_id: str, reward: float) -> Episode:
        return Episode(task=Task(id=task_id), reward=reward,
                       trajectories=[Trajectory(name="solver"), Trajectory(name="judge", reward=0.5)])

    groups = group_trajectories([ep("a", 1.0), ep("a", 0.0), ep("b", 1.0)])
    by_id = {g.group_id: g for g in groups}
    assert set(by_id) == {"a:solver", "a:judge", "b:solver", "b:judge"}
    assert by_id["a:solver"].rewards == [1.0, 0.0]  # inherits the episode reward
    assert by_id["a:judge"].rewards == [0.5, 0.5]  # keeps its own


def test_episode_steps_in_call_order_and_trajectory_lookup() -> None:
    e = _episode()
    a, b = e.trajectories[0].steps
    assert e.steps == sorted([a, b], key=lambda s: s.started_at)
    assert e.trajectory("solver").name == "solver"
    with pytest.raises(KeyError, match="has no trajectory named 'judge'"):
        e.trajectory("judge")


def test_infinite_and_nan_values_round_trip(tmp_path) -> None:
    """A -inf logprob or a NaN metric must not turn a record into one that can no longer be read."""
    import math

    step = _step(logprobs=[float("-inf"), -0.5])
    ep = Episode(task=Task(id="t"), trajectories=[Trajectory(steps=[step])], metrics={"loss": float("nan")})
    write_jsonl(tmp_path / "e.jsonl", [ep])
    [back] = read_jsonl(tmp_path / "e.jsonl")
    assert back.trajectories[0].steps[0].logprobs == [float("-inf"), -0.5]
    assert math.isnan(back.metrics["loss"])
