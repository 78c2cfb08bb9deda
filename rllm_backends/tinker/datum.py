"""TrainRow → `tinker.types.Datum`: the one-token shift, and where the loss mask goes.

A Tinker datum follows next-token alignment: position i of `model_input` predicts `target_tokens[i]`, which is
token i + 1 of the full sequence. So a row of N tokens becomes

- ``model_input``                 = tokens[:-1]                           (N − 1 tokens)
- ``loss_fn_inputs.target_tokens`` = tokens[1:]
- ``loss_fn_inputs.logprobs``      = π_old of tokens[1:] (the row's `old_logprobs` when a trainer recomputed
  them, else its `sampling_logprobs`), 0.0 where the token is not trained
- ``loss_fn_inputs.advantages``    = advantages[1:] · loss_mask[1:] · scale

Token 0 has no prefix to predict it from, so it is never trained (the local trainer drops it as well). Tinker's
RL losses (importance_sampling, ppo, cispo) take no mask input: they sum a per-token term that is a multiple of
the advantage, so a zero advantage *is* the mask. Observation / prompt tokens (mask 0, as packing makes them
between the turns of a multi-turn row) therefore get advantage 0, and their logprob 0.0 keeps the ratio
exp(target − 0) ≤ 1 finite there. `scale` is the per-row factor that turns Tinker's token sum into our loss
aggregation (see `losses.agg_scales`).

The module needs the `tinker` SDK; it is imported only when the Tinker backend is used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rllm_core.errors import TrainingError
from rllm_train.packing import TrainRow

if TYPE_CHECKING:
    from tinker import types

__all__ = ["behaviour_logprobs", "row_to_datum", "rows_to_datums"]


def behaviour_logprobs(row: TrainRow) -> list[float]:
    """π_old per token of the row (token-aligned, length len(tokens)): `old_logprobs` when a trainer recomputed
    them, else what the sampler reported."""
    return list(row.old_logprobs) if row.old_logprobs is not None else list(row.sampling_logprobs)


def _check_row(row: TrainRow, index: int) -> None:
    where = f"train row {index} (trajectory {row.trajectory_id or '?'})"
    if len(row.tokens) < 2:
        raise TrainingError(f"{where} has {len(row.tokens)} token(s); a Tinker datum needs at least 2 (a prefix "
                            "and a token to predict). Drop such rows before training")
    olds = behaviour_logprobs(row)
    for t in range(1, len(row.tokens)):
        if not row.loss_mask[t]:
            continue
        if not math.isfinite(olds[t]):
            name = "old_logprobs" if row.old_logprobs is not None else "sampling_logprobs"
            raise TrainingError(f"{where}: {name}[{t}] is {olds[t]} on a trained token; the sampler must report "
                                "a finite logprob for every generated token")
        if not math.isfinite(row.advantages[t]):
            raise TrainingError(f"{where}: advantage[{t}] is {row.advantages[t]} on a trained token; check the "
                                "rewards for NaN/inf")


def row_to_datum(row: TrainRow, scale: float = 1.0, *, index: int = 0, loss_fn: str = "") -> types.Datum:
    """One row as a Datum (see the module docstring); raises TrainingError for a row under 2 tokens or with a
    non-finite logprob / advantage on a trained token. For Tinker's `cross_entropy` (`--loss sft`) the scaled
    advantages are its `weights` and no logprobs are sent."""
    from tinker import types

    if not (math.isfinite(scale) and scale >= 0):
        raise TrainingError(f"advantage scale for train row {index} must be finite and ≥ 0, got {scale}")
    _check_row(row, index)
    olds = behaviour_logprobs(row)
    mask = row.loss_mask[1:]
    logprobs = [float(lp) if m else 0.0 for lp, m in zip(olds[1:], mask, strict=True)]
    advantages = [float(a) * scale if m else 0.0 for a, m in zip(row.advantages[1:], mask, strict=True)]
    if loss_fn == "cross_entropy":
        return types.Datum(model_input=types.ModelInput.from_ints([int(t) for t in row.tokens[:-1]]),
                           loss_fn_inputs={"target_tokens": [int(t) for t in row.tokens[1:]], "weights": advantages})
    return types.Datum(
        model_input=types.ModelInput.from_ints([int(t) for t in row.tokens[:-1]]),
        loss_fn_inputs={"target_tokens": [int(t) for t in row.tokens[1:]], "logprobs": logprobs,
                        "advantages": advantages},
    )


def rows_to_datums(rows: Sequence[TrainRow], scales: Sequence[float] | None = None, loss_fn: str = ""
                   ) -> list[types.Datum]:
    """Datums for `rows` (for the built-in `loss_fn`), row i's advantages multiplied by `scales[i]` (1.0 when
    `scales` is None)."""
    if scales is not None and len(scales) != len(rows):
        raise TrainingError(f"{len(scales)} advantage scales for {len(rows)} train rows; give one per row")
    return [row_to_datum(row, 1.0 if scales is None else float(scales[i]), index=i, loss_fn=loss_fn)
            for i, row in enumerate(rows)]
