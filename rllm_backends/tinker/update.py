"""One update on the Tinker service: rows → Datums → forward_backward + optim_step + snapshot, pipelined.

The three requests are submitted back to back before any is awaited, as Tinker's docs ask (the service then runs
them in one clock cycle instead of several), and `train_step` submits them before it returns, so they run while
the loop writes the step's episodes. The snapshot (`save_state` with a one-day expiry) is the state after this step:
what the next step restarts from if it fails.

A failed step is never resubmitted on the same client: its optim_step may already have applied (AdamW moves the
weights through momentum and weight decay even without fresh gradients; the SDK may have sent part of a chunked
forward_backward), and a failed custom loss poisons the client. Instead the client is rebuilt from the previous
step's snapshot and the whole step retried there, with backoff (tenacity), while the failure is transient. When
the tries are spent the client is rebuilt once more, so the weights are those of the last finished step, as the
seam promises for a TrainingError, and the loop checkpoints that step.

The update reads what it needs through `UpdateSession` (the backend's public clients, plan and settings) and
changes none of the backend's state: it returns a `StepOutcome` (metrics and the new snapshot) or raises
`StepFailed` (saying whether the live weights are still those of the last finished step), and the backend
applies either (`TinkerBackend._apply`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from rllm_backends.tinker import retry
from rllm_core.errors import TrainingError
from rllm_train.packing import TrainRow

__all__ = ["SNAPSHOT_TTL_S", "StepFailed", "StepOutcome", "StepUpdate", "UpdateSession", "reference_logprobs"]

SNAPSHOT_TTL_S = 24 * 3600
"""Per-step snapshots (for retries) expire after a day; checkpoints are saved without an expiry."""


class UpdateSession(Protocol):
    """What an update reads from the backend (TinkerBackend is one): its live clients, loss plan and settings.
    `restore(path)` replaces `training` with a client loaded from a snapshot."""

    training: Any
    reference: Any
    plan: Any
    config: Any
    steps_done: int
    snapshot_path: str | None

    def adam_params(self) -> Any: ...

    def restore(self, path: str) -> None: ...


@dataclass(frozen=True)
class StepOutcome:
    """A finished step: its metrics, and the snapshot of the state it left (the next step's restart point)."""

    metrics: dict[str, float]
    snapshot_path: str


class StepFailed(TrainingError):
    """The step could not be done. `weights_known`: the live client was rebuilt from the previous snapshot, so the
    weights are the last finished step's; False when even that failed (the backend restores before it saves)."""

    def __init__(self, message: str, *, weights_known: bool) -> None:
        super().__init__(message)
        self.weights_known = weights_known


async def _value(value: Any) -> Any:
    """An SDK future (awaitable), a coroutine, or a plain value, as a value."""
    while hasattr(value, "__await__"):
        value = await value
    return value


async def reference_logprobs(reference: Any, rows: list[TrainRow]) -> list[list[float]]:
    """The base model's logprob of every token of each row (0.0 for the first, which has no context)."""
    import tinker

    async def one(row: TrainRow) -> list[float]:
        values = await retry.acall_with_retries(
            lambda: _value(reference.compute_logprobs(tinker.types.ModelInput.from_ints(row.tokens))),
            what="compute_logprobs (KL reference)")
        return [0.0 if lp is None else float(lp) for lp in values]

    return list(await asyncio.gather(*(one(r) for r in rows)))


class StepUpdate:
    """The requests of one train step, their retries, and its metrics (see the module docstring)."""

    def __init__(self, session: UpdateSession, rows: list[TrainRow]) -> None:
        from rllm_backends.tinker.datum import rows_to_datums

        self.session, self.rows, self.plan = session, rows, session.plan
        scales = self.plan.scales(rows) if self.plan.kind == "builtin" else None
        self.datums = rows_to_datums(rows, scales, self.plan.loss_fn if self.plan.kind == "builtin" else "")
        self.loss_fn: Any = None
        self.futures: tuple[Any, Any, Any] | None = None
        self.failed_op = ""
        self.tries = 0
        self.lr = 0.0
        self.started = time.monotonic()

    def submit_now(self) -> None:
        """Queue the step on the service at once, unless KL first needs the reference logprobs."""
        if not self.plan.needs_ref_logprobs:
            self._build_loss(None)
            self.futures = self._submit()

    def _build_loss(self, ref: list[list[float]] | None) -> None:
        from rllm_backends.tinker.losses import make_custom_loss

        if self.plan.kind == "custom":
            self.loss_fn = make_custom_loss(self.rows, self.session.config, ref_logprobs=ref)

    def _submit(self) -> tuple[Any, Any, Any]:
        self.tries += 1
        training = self.session.training
        if self.plan.kind == "custom":
            fb = training.forward_backward_custom(self.datums, self.loss_fn)
        else:
            fb = training.forward_backward(self.datums, self.plan.loss_fn, self.plan.loss_fn_config)
        params = self.session.adam_params()
        self.lr = float(params.learning_rate)
        opt = training.optim_step(params)
        name = f"rllm-step{self.session.steps_done + 1}-{uuid.uuid4().hex[:8]}"
        snap = training.save_state(name, ttl_seconds=SNAPSHOT_TTL_S)
        return fb, opt, snap

    async def _await(self, futures: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        names = ("forward_backward_custom" if self.plan.kind == "custom" else "forward_backward", "optim_step",
                 "save_state")
        results = []
        for name, fut in zip(names, futures, strict=True):
            self.failed_op = name
            results.append(await _value(fut))
        self.failed_op = ""
        return results[0], results[1], results[2]

    async def _rollback(self) -> None:
        """A fresh client from the previous step's snapshot: the weights and optimizer as that step left them."""
        snapshot = self.session.snapshot_path
        if snapshot is None:
            raise TrainingError("no snapshot of the previous step to restart from")
        await asyncio.to_thread(self.session.restore, snapshot)

    async def run(self) -> StepOutcome:
        """Await the step (retrying it from the previous snapshot on transient failures); its outcome."""
        from rllm_backends.tinker.losses import builtin_metrics

        if self.futures is None:  # KL: the reference logprobs come first
            self._build_loss(await reference_logprobs(self.session.reference, self.rows))
            self.futures = self._submit()
        try:
            output, optim, snap = await self._await(self.futures)
        except Exception as exc:
            output, optim, snap = await self._retry(exc)
        metrics = builtin_metrics(self.rows, output, self.plan)
        optim_metrics = getattr(optim, "metrics", None) or {}
        metrics.update({f"tinker/{k}": float(v) for k, v in optim_metrics.items() if isinstance(v, int | float)})
        metrics["train/lr"] = self.lr
        metrics["tinker/tries"] = float(self.tries)
        metrics["time/tinker_update_s"] = time.monotonic() - self.started
        return StepOutcome(metrics, snap.path)

    async def _retry(self, first: Exception) -> tuple[Any, Any, Any]:
        op = self.failed_op
        if not retry.is_transient(first):
            raise StepFailed(f"the Tinker service refused {op}: {type(first).__name__}: {first}",
                             weights_known=await self._undo()) from first
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(max(retry.RETRY_ATTEMPTS - 1, 1)),
                                               wait=wait_exponential(multiplier=retry.RETRY_WAIT_S, max=60),
                                               retry=retry_if_exception(retry.is_transient), reraise=True):
                with attempt:
                    await self._rollback()
                    return await self._await(self._submit())
        except Exception as exc:
            raise StepFailed(f"the Tinker service failed {self.failed_op or op} after {self.tries} tries of the "
                             f"step: {type(exc).__name__}: {exc}", weights_known=await self._undo()) from exc
        raise AssertionError("unreachable")  # pragma: no cover - tenacity returns or raises

    async def _undo(self) -> bool:
        """Leave the live weights as the last finished step left them, if the service lets us; whether it did."""
        try:
            await self._rollback()
        except Exception:  # the service is down: the backend restores before it checkpoints
            return False
        return True
