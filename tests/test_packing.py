"""Packing trajectories into train rows: merging by prefix, observation masking, splits, over-long rules."""

from __future__ import annotations

import pytest

from rllm_core.types import Step, Trajectory, TrajectoryGroup
from rllm_train.packing import TrainRow, pack_groups, pack_trajectory


def _step(prompt: list[int], completion: list[int], version: int | None = 0, **kw: object) -> Step:
    return Step(prompt_token_ids=prompt, completion_token_ids=completion,
                logprobs=[-0.1 * (i + 1) for i in range(len(completion))], token_source="server",
                policy_version=version, **kw)


def test_multi_turn_steps_merge_with_observations_masked() -> None:
    s1 = _step([1, 2], [3, 4])
    s2 = _step([1, 2, 3, 4, 9, 9], [5], version=1)  # observation 9, 9 then completion 5
    rows, m = pack_trajectory(Trajectory(steps=[s1, s2]), 2.0, group_id="g")
    assert len(rows) == 1
    row = rows[0]
    assert row.tokens == [1, 2, 3, 4, 9, 9, 5]
    assert row.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert row.sampling_logprobs == pytest.approx([0, 0, -0.1, -0.2, 0, 0, -0.1])
    assert row.advantages == [0, 0, 2.0, 2.0, 0, 0, 2.0]
    assert row.policy_version == 0 and row.num_steps == 2 and row.group_id == "g"
    assert m["steps_used"] == 2 and m["rows_split"] == 0


def test_step_breaking_the_prefix_starts_a_new_row() -> None:
    s1 = _step([1, 2], [3])
    s2 = _step([7, 2, 3], [4])  # history rewritten
    rows, m = pack_trajectory(Trajectory(steps=[s1, s2]), 1.0)
    assert [r.tokens for r in rows] == [[1, 2, 3], [7, 2, 3, 4]]
    assert m["rows_split"] == 1


def test_untrainable_steps_are_skipped_and_counted() -> None:
    no_ids = Step(text="hi")
    errored = _step([1], [2], error="boom")
    rows, m = pack_trajectory(Trajectory(steps=[no_ids, errored, _step([1], [2])]), 1.0)
    assert len(rows) == 1 and m["steps_untrainable"] == 2


def test_overlong_truncate_and_drop() -> None:
    traj = Trajectory(steps=[_step([1, 2, 3], [4, 5, 6])])
    rows, m = pack_trajectory(traj, 1.0, max_tokens=4)
    assert rows[0].tokens == [1, 2, 3, 4] and rows[0].loss_mask == [0, 0, 0, 1] and m["rows_truncated"] == 1
    rows, m = pack_trajectory(traj, 1.0, max_tokens=4, overlong="drop")
    assert rows == [] and m["rows_dropped_overlong"] == 1
    rows, m = pack_trajectory(traj, 1.0, max_tokens=3)  # nothing trainable left: dropped
    assert rows == [] and m["rows_dropped_overlong"] == 1


def test_pack_groups_uses_each_trajectory_advantage() -> None:
    t1, t2 = Trajectory(steps=[_step([1], [2])]), Trajectory(steps=[_step([1], [3])])
    g = TrajectoryGroup(group_id="task:solver", task_id="task", role="solver", trajectories=[t1, t2])
    rows, m = pack_groups([g], {t1.id: 0.5, t2.id: -0.5})
    assert [r.advantages for r in rows] == [[0.0, 0.5], [0.0, -0.5]]
    assert [r.trajectory_id for r in rows] == [t1.id, t2.id]
    assert m["pack/rows"] == 2 and m["pack/trained_tokens"] == 2 and m["pack/tokens"] == 4


def test_train_row_validates_lengths() -> None:
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 tokens"):
        TrainRow(tokens=[1, 2], loss_mask=[1], sampling_logprobs=[0, 0], advantages=[0, 0])
