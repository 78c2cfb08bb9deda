"""Rollouts ahead of the trainer: with `--max-staleness K` (K ≥ 1) the episodes of steps s+1 … s+K run while step s
trains, so neither side waits for the other; K = 0 is the synchronous loop (each step's rollouts, then its update).

`RolloutPipeline.episodes(step)` returns the step's episodes (started earlier when K ≥ 1) and starts the next K
steps' before returning, so they overlap the update that follows. The policy that samples them is whatever the
server holds at the time: weights reach it without draining it (the backend's swap modes), and a Step that spans a
swap records each token's version. `drop_stale` then leaves out of training every trajectory holding a token more
than K versions behind the trainer (counted in `async/stale_dropped`; the episodes are saved whole), so no row older
than K reaches the update; the staleness of what is kept is logged (`async/staleness_mean` / `_max`, and a
histogram `async/staleness_hist/<d>`). With `--stale-rows mask` such a trajectory is kept instead, its tokens
older than K versions in the row untrained (`pack/stale_tokens_masked`): the fresh tail of a partial rollout that
spanned a swap still teaches.

Episodes started for steps the run never reaches (the last steps, a crash, Ctrl-C) are cancelled and never
written: a resumed run draws the same tasks for those steps (tasks are a function of seed and step) and runs them
again, so an episode is neither lost nor counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from rllm_core.types import Episode, Step, TrajectoryGroup

__all__ = ["RolloutPipeline", "drop_stale", "min_trained_version", "oldest_version"]


class RolloutPipeline:
    """The producer side of the loop (module docstring). `start_step(step)` is the coroutine that runs a step's
    rollouts; steps past `last_step` are never started."""

    def __init__(self, start_step: Callable[[int], Coroutine[Any, Any, list[Episode]]], max_staleness: int,
                 last_step: int) -> None:
        self.start_step, self.k, self.last_step = start_step, max_staleness, last_step
        self._running: dict[int, asyncio.Task[list[Episode]]] = {}

    def _start(self, step: int) -> None:
        if step <= self.last_step and step not in self._running:
            self._running[step] = asyncio.ensure_future(self.start_step(step))

    async def episodes(self, step: int) -> tuple[list[Episode], float]:
        """(the step's episodes, seconds the trainer waited for them)."""
        if self.k == 0:
            started = time.perf_counter()
            return await self.start_step(step), time.perf_counter() - started
        self._start(step)
        started = time.perf_counter()
        episodes = await self._running.pop(step)
        waited = time.perf_counter() - started
        for ahead in range(step + 1, step + self.k + 1):  # they sample while this step trains
            self._start(ahead)
        return episodes, waited

    async def close(self) -> None:
        """Cancel the episodes of steps that will not be trained (they are re-run by a resume)."""
        running, self._running = list(self._running.values()), {}
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def oldest_version(steps: Sequence[Step]) -> int | None:
    """The oldest policy version any token of `steps` was sampled with (per-token versions where recorded)."""
    versions = [v for s in steps for v in (s.token_policy_versions or
                                           ([s.policy_version] if s.policy_version is not None else []))]
    return min(versions) if versions else None


def drop_stale(groups: list[TrajectoryGroup], trainer_version: int, max_staleness: int, rule: str = "drop"
               ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """With rule "drop": the groups without trajectories holding a token more than `max_staleness` versions
    behind `trainer_version` (the episodes themselves stay whole: episodes.jsonl keeps what was sampled). With
    "mask" every trajectory is kept (packing then masks the stale tokens: `min_trained_version`). Either way the
    counts, the staleness of what is kept and a histogram of every trajectory's staleness
    (`async/staleness_hist/<versions behind>`)."""
    dropped, kept, out = 0, [], []
    histogram: Counter[int] = Counter()
    for group in groups:
        fresh = []
        for trajectory in group.trajectories:
            oldest = oldest_version(trajectory.steps)
            behind = None if oldest is None else trainer_version - oldest
            if behind is not None:
                histogram[behind] += 1
            if rule == "drop" and behind is not None and behind > max_staleness:
                dropped += 1
                continue
            fresh.append(trajectory)
            if behind is not None:
                kept.append(behind)
        if fresh:
            out.append(group.model_copy(update={"trajectories": fresh}))
    metrics = {"async/stale_dropped": float(dropped),
               "async/staleness_mean": sum(kept) / len(kept) if kept else 0.0,
               "async/staleness_max": float(max(kept, default=0))}
    metrics.update({f"async/staleness_hist/{behind}": float(n) for behind, n in sorted(histogram.items())})
    return out, metrics


def min_trained_version(trainer_version: int, max_staleness: int, rule: str) -> int | None:
    """The oldest policy version whose tokens are trained under `--stale-rows mask` (None: no token is masked)."""
    return trainer_version - max_staleness if rule == "mask" and max_staleness > 0 else None
