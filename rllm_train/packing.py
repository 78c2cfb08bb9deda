"""Packing: Trajectories → train rows (one token sequence each, with what the loss needs per token).

Rule for multi-turn trajectories: a step whose `prompt_token_ids` start with the previous row's full sequence
(its prompt + completion tokens so far) is *merged* into that row: the new prompt tokens beyond the prefix
(tool results, user turns: observations) are appended with loss mask 0, then its completion with mask 1. A
step that breaks the prefix (the agent rewrote or summarised its history) starts a new row. Only
`Step.trainable` steps are used; the others are counted.

With `min_version` (asynchronous training, `--stale-rows mask`) a completion token sampled by a policy older than
it keeps its place in the row with loss mask 0 (`stale_tokens_masked`): the row stays whole as context, only the
fresh tokens are trained, and the row's `policy_version` is the oldest among those.

Over-long rows (more than `max_tokens`): ``truncate`` keeps the first `max_tokens` tokens (the tail's loss is
lost; a row left with no trained token is dropped), ``drop`` drops the row. Both are counted in the metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rllm_core.types import Step, Trajectory, TrajectoryGroup
from rllm_rollout.capture.images import message_images

__all__ = ["OverlongRule", "TrainRow", "pack_groups", "pack_trajectory", "step_temperature"]

OverlongRule = Literal["truncate", "drop"]


class TrainRow(BaseModel):
    """One training sequence. All per-token lists have the same length as `tokens`."""

    model_config = ConfigDict(extra="forbid")

    tokens: list[int]
    loss_mask: list[int]
    """1 on tokens the policy generated (trained), 0 on prompt / observation tokens."""
    sampling_logprobs: list[float]
    """Behaviour log-probs: what the sampler reported for each trained token (0.0 where the mask is 0). Kept
    as sampled even when a backend recomputes π_old, so decoupled PPO / truncated importance sampling can use
    both."""
    advantages: list[float]
    old_logprobs: list[float] | None = None
    """π_old recomputed by a trainer's own forward pass (None: not recomputed; use `sampling_logprobs`)."""
    temperature: float | None = None
    """The sampling temperature of the row's steps (None: not recorded; the backend's configured one)."""
    group_id: str = ""
    trajectory_id: str = ""
    role: str = ""
    """The trajectory's role (its name): with --roles it picks the LoRA adapter the row trains."""
    policy_version: int | None = None
    """The oldest policy version among the merged steps (how stale the row is)."""
    num_steps: int = 1
    images: list[str] = Field(default_factory=list)
    """The images the row's prompt shows, in order (data or http(s) URLs, as the agent sent them): a vision model's
    trainer runs them through its processor and vision tower again to score the row's image tokens."""
    metadata: dict[str, str | int | float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_lengths(self) -> TrainRow:
        n = len(self.tokens)
        for name in ("loss_mask", "sampling_logprobs", "advantages", "old_logprobs"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"TrainRow: {name} has {len(getattr(self, name))} entries for {n} tokens")
        return self

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def behaviour_logprobs(self) -> list[float]:
        """The sampler's log-probs (an alias of `sampling_logprobs`, under the name off-policy papers use)."""
        return self.sampling_logprobs


def step_temperature(step: Step) -> float | None:
    """The temperature a step was sampled at, as its request sent it (None when the request named none)."""
    value = step.params.get("temperature")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _token_versions(step: Step) -> list[int | None]:
    """The policy version of each completion token (the step's one where the server gave none per token)."""
    if step.token_policy_versions:
        return list(step.token_policy_versions)
    return [step.policy_version] * len(step.completion_token_ids or [])


class _Building:
    def __init__(self, step: Step, min_version: int | None = None) -> None:
        self.min_version = min_version
        self.stale_masked = 0
        self.tokens = list(step.prompt_token_ids or [])
        self.mask = [0] * len(self.tokens)
        self.logprobs = [0.0] * len(self.tokens)
        self.versions: list[int] = []
        self.num_steps = 0
        self.temperature = step_temperature(step)
        self.images = message_images(step.messages)
        self.add_completion(step)

    def extends(self, step: Step) -> bool:
        """The step continues this row: its prompt starts with the whole row, sampled at the same temperature
        (one row carries one temperature, so a trainer scores every token at the temperature it was drawn at)."""
        prompt = step.prompt_token_ids or []
        return (len(prompt) >= len(self.tokens) and prompt[: len(self.tokens)] == self.tokens
                and step_temperature(step) == self.temperature)

    def add_observation(self, step: Step) -> None:
        extra = (step.prompt_token_ids or [])[len(self.tokens) :]
        self.tokens += extra
        self.mask += [0] * len(extra)
        self.logprobs += [0.0] * len(extra)
        self.images = message_images(step.messages)  # the whole conversation so far: every image up to here
        self.add_completion(step)

    def add_completion(self, step: Step) -> None:
        ids, lps = step.completion_token_ids or [], step.logprobs or []
        versions = _token_versions(step)
        floor = self.min_version
        mask = [0 if floor is not None and v is not None and v < floor else 1 for v in versions]
        self.stale_masked += len(mask) - sum(mask)
        self.tokens += ids
        self.mask += mask
        self.logprobs += [float(x) if m else 0.0 for x, m in zip(lps, mask, strict=True)]
        kept = [v for v, m in zip(versions, mask, strict=True) if m and v is not None]
        if kept:  # the oldest policy that sampled any of its trained tokens
            self.versions.append(min(kept))
        self.num_steps += 1


def pack_trajectory(
    trajectory: Trajectory,
    advantage: float,
    *,
    group_id: str = "",
    role: str | None = None,
    max_tokens: int | None = None,
    overlong: OverlongRule = "truncate",
    min_version: int | None = None,
) -> tuple[list[TrainRow], dict[str, float]]:
    """Rows for one trajectory (merged where prefixes allow) and counts: steps used/skipped, rows cut/dropped,
    stale tokens masked (tokens older than `min_version`: module docstring)."""
    metrics = {"steps_used": 0.0, "steps_untrainable": 0.0, "rows_truncated": 0.0, "rows_dropped_overlong": 0.0,
               "rows_split": 0.0, "stale_tokens_masked": 0.0, "rows_dropped_stale": 0.0}
    building: list[_Building] = []
    for step in trajectory.steps:
        if not step.trainable:
            metrics["steps_untrainable"] += 1
            continue
        metrics["steps_used"] += 1
        if building and building[-1].extends(step):
            building[-1].add_observation(step)
        else:
            if building:
                metrics["rows_split"] += 1
            building.append(_Building(step, min_version))
    rows: list[TrainRow] = []
    for b in building:
        metrics["stale_tokens_masked"] += b.stale_masked
        if b.stale_masked and not any(b.mask):
            metrics["rows_dropped_stale"] += 1
            continue
        tokens, mask, lps = b.tokens, b.mask, b.logprobs
        if max_tokens is not None and len(tokens) > max_tokens:
            if overlong == "drop":
                metrics["rows_dropped_overlong"] += 1
                continue
            tokens, mask, lps = tokens[:max_tokens], mask[:max_tokens], lps[:max_tokens]
            metrics["rows_truncated"] += 1
        if not any(mask):
            metrics["rows_dropped_overlong"] += 1
            continue
        rows.append(TrainRow(
            tokens=tokens, loss_mask=mask, sampling_logprobs=lps,
            advantages=[advantage * m for m in mask], group_id=group_id, trajectory_id=trajectory.id,
            role=trajectory.name if role is None else role,
            policy_version=min(b.versions) if b.versions else None, num_steps=b.num_steps,
            temperature=b.temperature, images=b.images,
        ))
    return rows, metrics


def pack_groups(
    groups: Sequence[TrajectoryGroup],
    advantages: Mapping[str, float],
    *,
    max_tokens: int | None = None,
    overlong: OverlongRule = "truncate",
    min_version: int | None = None,
) -> tuple[list[TrainRow], dict[str, float]]:
    """Pack every trajectory of every group with its advantage (trajectory id → advantage); tokens sampled by a
    policy older than `min_version` are kept untrained (module docstring)."""
    rows: list[TrainRow] = []
    totals: dict[str, float] = {}
    for g in groups:
        for traj in g.trajectories:
            r, m = pack_trajectory(traj, advantages.get(traj.id, 0.0), group_id=g.group_id, role=g.role,
                                   max_tokens=max_tokens, overlong=overlong, min_version=min_version)
            rows += r
            for k, v in m.items():
                totals[k] = totals.get(k, 0.0) + v
    totals = {f"pack/{k}": v for k, v in totals.items()}
    totals["pack/rows"] = float(len(rows))
    totals["pack/tokens"] = float(sum(len(r.tokens) for r in rows))
    totals["pack/trained_tokens"] = float(sum(r.num_trained_tokens for r in rows))
    return rows, totals
