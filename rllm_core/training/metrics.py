"""Per-step metrics computed from episodes, and a phase timer. Names are `<area>/<what>` so a monitor can
group them: reward/*, episode/*, reason/*, groups/*, pack/*, train/*, time/*."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rllm_core.types import Episode

__all__ = ["PhaseTimer", "episode_metrics"]


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
    for reason, count in Counter(e.reward_reason or "unscored" for e in episodes).items():
        out[f"{prefix}reason/{reason}"] = count / n
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
