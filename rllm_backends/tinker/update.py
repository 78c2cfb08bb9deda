"""One update on the Tinker service: rows → Datums → forward_backward (+ optim_step, pipelined) → metrics.

`forward_backward` and `optim_step` are submitted back to back before either is awaited, as Tinker's docs ask
(the service then runs them in one clock cycle instead of two). A transient failure of either is retried with
backoff (`retry.acall_with_retries`); a failed forward_backward is retried alone and its optim_step submitted
again after it, so a step never applies gradients twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from rllm_backends.tinker.retry import acall_with_retries, is_transient
from rllm_core.errors import TrainingError
from rllm_core.training.packing import TrainRow

if TYPE_CHECKING:
    from rllm_backends.tinker.backend import TinkerBackend

__all__ = ["reference_logprobs", "run_update"]


async def reference_logprobs(reference: Any, rows: list[TrainRow]) -> list[list[float]]:
    """The base model's logprob of every token of each row (0.0 for the first, which has no context)."""
    import tinker

    async def one(row: TrainRow) -> list[float]:
        fut = await acall_with_retries(
            lambda: _awaitable(reference.compute_logprobs(tinker.types.ModelInput.from_ints(row.tokens))),
            what="compute_logprobs (KL reference)")
        return [0.0 if lp is None else float(lp) for lp in fut]

    return list(await asyncio.gather(*(one(r) for r in rows)))


async def _awaitable(value: Any) -> Any:
    """An SDK future (awaitable), a coroutine, or a plain value, as a value."""
    while hasattr(value, "__await__"):
        value = await value
    return value


async def run_update(backend: TinkerBackend, rows: list[TrainRow]) -> dict[str, float]:
    """Train one step on `rows` through `backend.training`; the step's metrics."""
    from rllm_backends.tinker.datum import rows_to_datums
    from rllm_backends.tinker.losses import builtin_metrics, make_custom_loss

    plan, training, config = backend.plan, backend.training, backend.config
    started = time.monotonic()
    ref = await reference_logprobs(backend.reference, rows) if plan.needs_ref_logprobs else None
    if plan.kind == "custom":
        datums = rows_to_datums(rows)
        loss_fn = make_custom_loss(rows, config, ref_logprobs=ref)

        def submit_fb() -> Any:
            return training.forward_backward_custom(datums, loss_fn)
    else:
        datums = rows_to_datums(rows, plan.scales(rows))

        def submit_fb() -> Any:
            return training.forward_backward(datums, plan.loss_fn, plan.loss_fn_config)

    def submit_opt() -> Any:
        return training.optim_step(backend.adam_params())

    fb_future, opt_future = submit_fb(), submit_opt()  # pipelined: both queued before either is awaited
    try:
        output = await _awaitable(fb_future)
    except Exception as exc:
        with contextlib.suppress(Exception):  # the step queued behind the failed one had no fresh gradients
            await _awaitable(opt_future)
        if not is_transient(exc):
            raise TrainingError(f"the Tinker service refused forward_backward: {type(exc).__name__}: {exc}") from exc
        output = await acall_with_retries(lambda: _awaitable(submit_fb()), what="forward_backward")
        opt_future = None
    if opt_future is not None:
        try:
            optim = await _awaitable(opt_future)
        except Exception as exc:
            if not is_transient(exc):
                raise TrainingError(f"the Tinker service refused optim_step: {type(exc).__name__}: {exc}") from exc
            opt_future = None
    if opt_future is None:
        optim = await acall_with_retries(lambda: _awaitable(submit_opt()), what="optim_step")
    metrics = builtin_metrics(rows, output, plan)
    optim_metrics = getattr(optim, "metrics", None) or {}
    metrics.update({f"tinker/{k}": float(v) for k, v in optim_metrics.items() if isinstance(v, int | float)})
    metrics["time/tinker_update_s"] = time.monotonic() - started
    return metrics
