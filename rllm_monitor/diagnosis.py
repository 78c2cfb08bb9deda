"""Why episodes got no reward, per episodes file and over steps; groups of attempts at one task.

Computed from the episode index (one small summary per episode: reward, reason, error, has_token_ids),
never from the episodes themselves, so a step of 10,000 episodes is diagnosed in milliseconds.

A zero-reward episode is one whose reward is missing or not positive (some graders give -1 for a wrong
answer). Each gets exactly ONE reason, so a step's counts add up to its zero-reward episodes:

1. ``timeout`` / ``error`` when the grader or engine recorded that reason;
2. ``error`` when the episode carries an error message (the agent crashed) whatever else it says;
3. ``empty_token_ids`` when no step of it carries completion token ids: a capture problem — the episode
   cannot train whatever its grade, and it is the one reason a grader never reports;
4. otherwise the grader's reason (``wrong_answer``, ``no_answer_extracted``, ``format_error``,
   ``truncated`` or whatever a custom grader records), or ``unknown`` when there is none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

__all__ = ["EXAMPLES_PER_REASON", "GroupRow", "StepDiagnosis", "as_dict", "diagnose_file", "group_rows",
           "is_zero", "zero_reason"]

EXAMPLES_PER_REASON = 3


def as_dict(obj: Any) -> dict[str, Any]:
    """A reader record (pydantic model, dataclass or dict) as a plain dict."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    return dict(vars(obj))


def is_zero(reward: float | None) -> bool:
    """No reward earned: missing (ungraded) or not positive."""
    return reward is None or reward <= 0


def zero_reason(summary: Mapping[str, Any]) -> str:
    """The one reason of a zero-reward episode, by the priority in the module docstring."""
    reason = summary.get("reason")
    if reason in ("timeout", "error"):
        return str(reason)
    if summary.get("error"):
        return "error"
    if summary.get("has_token_ids") is False:
        return "empty_token_ids"
    return str(reason) if reason else "unknown"


class GroupRow(BaseModel):
    """The attempts at one task in one file: n rewards side by side, and whether they all agree."""

    task_id: str
    indices: list[int]
    rewards: list[float | None]
    all_zero: bool
    all_one: bool


class StepDiagnosis(BaseModel):
    """One episodes file's zero-reward breakdown: counts by reason, ≤3 example indices per reason, groups."""

    file: str
    kind: str
    step: int | None
    episodes: int
    zero_reward: int
    reasons: dict[str, int]
    examples: dict[str, list[int]]
    groups: int
    all_zero_groups: int
    all_one_groups: int


def group_rows(summaries: Sequence[Mapping[str, Any]]) -> list[GroupRow]:
    """Episodes grouped by task id, in order of first appearance. all_one: every attempt earned ≥ 1 (full
    marks); all_zero: none earned anything. Either way the group has no spread, so GRPO learns nothing from it."""
    by_task: dict[str, list[int]] = {}
    for i, s in enumerate(summaries):
        by_task.setdefault(str(s.get("task_id")), []).append(i)
    rows = []
    for task_id, indices in by_task.items():
        rewards = [summaries[i].get("reward") for i in indices]
        rows.append(GroupRow(task_id=task_id, indices=indices, rewards=rewards,
                             all_zero=all(is_zero(r) for r in rewards),
                             all_one=all(r is not None and r >= 1 for r in rewards)))
    return rows


def diagnose_file(file: Mapping[str, Any], summaries: Iterable[Mapping[str, Any]]) -> StepDiagnosis:
    """The breakdown of one file (`file` is its entry of the reader's files(): name, kind, step)."""
    rows = list(summaries)
    reasons: dict[str, int] = {}
    examples: dict[str, list[int]] = {}
    for i, s in enumerate(rows):
        if not is_zero(s.get("reward")):
            continue
        reason = zero_reason(s)
        reasons[reason] = reasons.get(reason, 0) + 1
        shown = examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_PER_REASON:
            shown.append(i)
    groups = group_rows(rows)
    return StepDiagnosis(
        file=str(file.get("name")), kind=str(file.get("kind") or "train"), step=file.get("step"),
        episodes=len(rows), zero_reward=sum(reasons.values()), reasons=dict(sorted(reasons.items())),
        examples=dict(sorted(examples.items())), groups=len(groups),
        all_zero_groups=sum(g.all_zero for g in groups), all_one_groups=sum(g.all_one for g in groups))
