"""Rejection sampling: drop attempts that carry no learning signal before they cost a backward pass.

A group whose rewards are all equal has zero group-relative advantage for every member, so it only adds
compute (and, under token-mean aggregation, dilutes the loss of the groups that do teach something).

Modes:
- ``none``    keep everything (the too-easy / too-hard fractions are still measured).
- ``group``   drop each (task, role) TrajectoryGroup whose rewards are all equal.
- ``episode`` decide per task on the *episode* rewards: when all attempts at a task scored the same, drop
  every group of that task (all roles together, so a multi-agent episode is never half-trained).

"Too easy" = all equal and > 0 (every attempt succeeded); "too hard" = all equal and ≤ 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from rllm_core.errors import ConfigError
from rllm_core.types import Episode, TrajectoryGroup
from rllm_train.algorithms.names import REJECTION_MODES

__all__ = ["REJECTION_MODES", "classify_rewards", "filter_groups"]


def classify_rewards(rewards: Sequence[float], tol: float = 1e-9) -> str:
    """'mixed' when the rewards differ, else 'too_easy' (all > 0) or 'too_hard' (all ≤ 0, or no rewards); a
    group of one is never mixed."""
    if not rewards:
        return "too_hard"
    if max(rewards) - min(rewards) > tol:
        return "mixed"
    return "too_easy" if rewards[0] > 0 else "too_hard"


def filter_groups(
    groups: Sequence[TrajectoryGroup], mode: str = "none", episodes: Iterable[Episode] = ()
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Apply rejection sampling `mode`; return the kept groups and metrics (fractions too easy / too hard)."""
    if mode not in REJECTION_MODES:
        raise ConfigError(f"unknown rejection sampling mode {mode!r}; choose one of {', '.join(REJECTION_MODES)}")
    kinds = [classify_rewards(g.rewards) for g in groups]
    n = max(len(groups), 1)
    metrics = {
        "groups/total": float(len(groups)),
        "groups/frac_too_easy": kinds.count("too_easy") / n,
        "groups/frac_too_hard": kinds.count("too_hard") / n,
    }
    if mode == "none":
        kept = list(groups)
    elif mode == "group":
        kept = [g for g, k in zip(groups, kinds, strict=True) if k == "mixed"]
    else:
        by_task: dict[str, list[float]] = defaultdict(list)
        for ep in episodes:
            by_task[ep.task.id].append(ep.reward if ep.reward is not None else 0.0)
        if not by_task:
            raise ConfigError("rejection sampling mode 'episode' needs the episodes (pass episodes=)")
        flat = {tid for tid, rs in by_task.items() if classify_rewards(rs) != "mixed"}
        kept = [g for g in groups if g.task_id not in flat]
    metrics["groups/kept"] = float(len(kept))
    metrics["groups/dropped"] = float(len(groups) - len(kept))
    return kept, metrics
