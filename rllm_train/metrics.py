"""Per-step metrics computed from episodes, and a phase timer. Names are `<area>/<what>` so a monitor can
group them: reward/*, episode/*, reason/*, groups/*, pack/*, train/*, time/*."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rllm_core.types import Episode

__all__ = ["PhaseTimer", "episode_metrics", "role_metrics"]


def episode_metrics(episodes: Sequence[Episode], prefix: str = "") -> dict[str, float]:
    """Reward mean/std, accuracy, response length, number of LLM calls, and the reasons breakdown."""
    if not episodes:
        return {f"{prefix}episode/count": 0.0}
    rewards = [e.reward if e.reward is not None else 0.0 for e in episodes]
    correct = [1.0 if e.is_correct else 0.0 for e in episodes]
    lengths = [sum(len(s.completion_token_ids or []) for s in e.steps) for e in episodes]
    calls = [len(e.steps) for e in episodes]
    n = len(episodes)
    out = {
        f"{prefix}reward/mean": statistics.fmean(rewards),
        f"{prefix}reward/std": statistics.pstdev(rewards) if n > 1 else 0.0,
        f"{prefix}reward/accuracy": statistics.fmean(correct),
        f"{prefix}episode/count": float(n),
        f"{prefix}episode/response_tokens_mean": statistics.fmean(lengths),
        f"{prefix}episode/response_tokens_max": float(max(lengths)),
        f"{prefix}episode/llm_calls_mean": statistics.fmean(calls),
        f"{prefix}episode/errors": float(sum(1 for e in episodes if e.error is not None)),
    }
    solved: dict[str, bool] = {}  # best of the attempts: a task counts once, solved if any attempt was correct
    for e in episodes:
        solved[e.task.id] = solved.get(e.task.id, False) or bool(e.is_correct)
    out[f"{prefix}reward/tasks_solved"] = float(sum(solved.values()))
    out[f"{prefix}reward/tasks"] = float(len(solved))
    for reason, count in Counter(e.reward_reason or "unscored" for e in episodes).items():
        out[f"{prefix}reason/{reason}"] = count / n
    out.update(role_metrics(episodes, prefix))
    return out


def role_metrics(episodes: Sequence[Episode], prefix: str = "") -> dict[str, float]:
    """Per role of a multi-agent episode (solver, judge, ...): mean reward, accuracy (reward ≥ 1: a judge that
    picked a correct answer), trajectories and LLM calls per episode. Empty for one-trajectory rollouts."""
    by_role: dict[str, list[tuple[float, int]]] = {}
    for ep in episodes:
        for traj in ep.trajectories:
            reward = traj.reward if traj.reward is not None else (ep.reward or 0.0)
            by_role.setdefault(traj.name, []).append((float(reward), len(traj.steps)))
    if len(by_role) < 2:
        return {}
    out: dict[str, float] = {}
    for role, vals in by_role.items():
        rewards = [r for r, _ in vals]
        out[f"{prefix}role/{role}/reward_mean"] = statistics.fmean(rewards)
        out[f"{prefix}role/{role}/accuracy"] = statistics.fmean(1.0 if r >= 1.0 else 0.0 for r in rewards)
        out[f"{prefix}role/{role}/trajectories"] = float(len(vals))
        out[f"{prefix}role/{role}/llm_calls_mean"] = statistics.fmean(float(s) for _, s in vals)
    return out


class PhaseTimer:
    """Seconds per phase of a step: `with timer("rollout"): ...` → metrics `time/rollout_s`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}_s": v for k, v in self.seconds.items()}
