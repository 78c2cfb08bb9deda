"""The learning rate of each step, as the local trainer's scheduler gives it (transformers' `get_scheduler`).

The service's `optim_step` takes a learning rate per call, so the schedule lives here: the same warm-up and
decay shapes as `rllm_backends.local_torch.trainer` (constant_with_warmup / linear / cosine, half a cosine cycle),
evaluated at the number of optimizer steps already taken. Pure Python, so it needs no torch.
"""

from __future__ import annotations

import math

__all__ = ["lr_at"]


def lr_at(step: int, *, lr: float, warmup_steps: int, schedule: str, max_steps: int) -> float:
    """The learning rate of the optimizer step taken after `step` earlier ones (0-based)."""
    total = max(max_steps, 1)
    if step < warmup_steps:
        return lr * step / max(1, warmup_steps)
    if schedule == "constant":
        return lr
    progress = (step - warmup_steps) / max(1, total - warmup_steps)
    if schedule == "linear":
        return lr * max(0.0, (total - step) / max(1, total - warmup_steps))
    if schedule == "cosine":
        return lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown lr schedule {schedule!r}; choose constant, linear or cosine")
