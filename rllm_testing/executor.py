"""A rollout executor double (the seam is rllm_rollout.executor): episodes one at a time, every batch recorded.

For tests of code that USES an executor (the training loop, eval): it runs each task × attempt in order, in this
process, through the same engine as `LocalExecutor` with a concurrency of 1, so a test sees the batches the
caller asked for (`batches`) and gets deterministic episode order without threads or Ray.
"""

from __future__ import annotations

import dataclasses

from rllm_core.types import Episode
from rllm_rollout.executor import EpisodeBatch, LocalExecutor

__all__ = ["SequentialExecutor"]


class SequentialExecutor(LocalExecutor):
    """Runs every batch with concurrency 1 and records it; `fail_on_batch` (1-based) raises there instead."""

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.batches: list[EpisodeBatch] = []
        self.fail_on_batch = fail_on_batch

    async def run(self, batch: EpisodeBatch) -> list[Episode]:
        self.batches.append(batch)
        if self.fail_on_batch == len(self.batches):
            raise RuntimeError(f"SequentialExecutor: batch {len(self.batches)} fails as asked")
        return await super().run(dataclasses.replace(batch, concurrency=1, progress=False))
