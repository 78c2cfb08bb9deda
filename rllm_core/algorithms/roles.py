"""Advantages for TrajectoryGroups, with one estimator per role (e.g. solver → grpo, judge → reinforce)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from rllm_core.algorithms.advantages import compute_advantages, estimator_for_role
from rllm_core.types import TrajectoryGroup

__all__ = ["group_advantages"]


def group_advantages(
    groups: Sequence[TrajectoryGroup], estimator: str | Mapping[str, str] = "grpo"
) -> dict[str, float]:
    """Trajectory id → advantage. Groups sharing an estimator are computed together, so a batch-level
    estimator (reinforce++ baseline whitening) whitens over those trajectories only, not over other roles'."""
    by_estimator: dict[str, list[TrajectoryGroup]] = defaultdict(list)
    for g in groups:
        by_estimator[estimator_for_role(g.role, estimator)].append(g)
    out: dict[str, float] = {}
    for name, gs in by_estimator.items():
        ids = [t.id for g in gs for t in g.trajectories]
        rewards = [r for g in gs for r in g.rewards]
        gids = [g.group_id for g in gs for _ in g.trajectories]
        out.update(zip(ids, compute_advantages(name, rewards, gids).tolist(), strict=True))
    return out
