"""rllm train rows → verl 0.9 `DataProto`, laid out exactly as verl's agent loop hands batches to its actor.

verl 0.9.1 has no ``dp_actor.update_policy`` any more: the PPO trainer turns the batch into a TensorDict
(``DataProto.to_tensordict``, meta_info becoming non-tensor entries), strips padding with
``verl.workers.utils.padding.left_right_2_no_padding`` and calls the engine worker's ``update_actor`` /
``compute_log_prob`` (``verl/trainer/ppo/ray_trainer.py:1290-1375``), whose loss is
``verl.workers.utils.losses.ppo_loss``. Those read the layout built by
``verl/experimental/agent_loop/agent_loop.py:_agent_loop_postprocess``, which this module reproduces:

=================== ======= ==========================================================================
field               dtype   per row i (P = prompt width, R = response width of the batch)
=================== ======= ==========================================================================
prompts             int64   [B, P]  tokens before the first trained token, LEFT-padded with pad_token_id
responses           int64   [B, R]  the rest of the row (completions and observations), RIGHT-padded
input_ids           int64   [B, P+R] cat(prompts, responses)
attention_mask      int64   [B, P+R] 1 on every real token (observations included), 0 on padding
position_ids        int64   [B, P+R] clip(cumsum(attention_mask) − 1, min=0) (verl.utils.model)
response_mask       int64   [B, R]  our loss mask on the response: observation tokens and padding are 0
rollout_log_probs   float32 [B, R]  the sampler's (behaviour) log-probs, 0 where response_mask is 0
old_log_probs       float32 [B, R]  row.old_logprobs when recomputed, else the behaviour log-probs
advantages          float32 [B, R]  per token, 0 where response_mask is 0
uid (non-tensor)    object  [B]     row.group_id (verl groups GRPO by it; our advantages are final already)
trajectory_id       object  [B]     row.trajectory_id
multi_modal_inputs  object  [B]     rows with images: the processor's tensors for them (pixel_values, ...),
                                    as verl's agent loop stores them; its engine passes them to the model
=================== ======= ==========================================================================

meta_info: ``temperature`` (the engine divides logits by it, ``transformer_impl.py:1159``), ``pad_token_id``
(used when ``use_remove_padding`` is off), ``global_batch_size`` = B (``ppo_loss`` reads it: the seq-mean
denominators, so they equal our row count), ``mini_batch_size`` = B (one optimizer step per batch, as rllm
does) and ``global_token_num`` (tokens per row, for verl's throughput metrics). ``token_level_rewards`` /
``returns`` are not built: only advantage estimation and the critic read them, never the actor update.
verl's own ``_update_actor`` overwrites ``global_batch_size`` / ``temperature`` with its config's
(``ppo_mini_batch_size × rollout.n``, ``rollout.temperature``: ``ray_trainer.py:1331,1353-1362``), which differ
from ours when packing split or dropped rows. verl also needs B divisible by the micro-batch size
(``workers/engine/utils.py:126``, unless ``use_dynamic_bsz``) and by the mini-batch size
(``utils/tensordict_utils.py:588``): the caller pads or sizes batches accordingly.

Position 0 has no prefix to predict it from, so it is never trained (as in the local trainer): a row whose
first token is marked trained is split after it. verl needs a non-empty prompt per row
(``verl/workers/utils/padding.py:no_padding_2_padding`` asserts it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rllm_core.errors import TrainingError
from rllm_train.packing import TrainRow

if TYPE_CHECKING:
    import torch
    from verl import DataProto

__all__ = ["GREEDY_BELOW", "VerlBatchError", "add_rollout_is_weights", "response_tensor_to_row_lists",
           "rows_to_dataproto", "scoring_temperature"]

GREEDY_BELOW = 1e-5
"""Temperatures below this were decoded greedily and their log-probs reported at T = 1 (vLLM's and rllm's
serving rule), so such rows are scored at 1.0: dividing logits by ~0 would overflow."""


class VerlBatchError(TrainingError, ValueError):
    """Rows that cannot become a verl batch (a ValueError too, so generic callers can catch it)."""


def scoring_temperature(rows: Sequence[TrainRow], temperature: float | None = None) -> float:
    """The one temperature verl must score `rows` at: each row's recorded one, `temperature` for rows that
    recorded none. verl's trainer sends a single scalar per batch, so rows drawn at different temperatures
    are refused rather than scored at the wrong one (which would make every ratio ≠ 1 before any update)."""
    seen: dict[float, str] = {}
    for i, row in enumerate(rows):
        t = row.temperature if row.temperature is not None else temperature
        if t is None:
            raise VerlBatchError(f"row {i} ({row.trajectory_id or 'no id'}) records no sampling temperature; "
                                 "pass temperature= (the configured one) to rows_to_dataproto")
        if t < 0:
            raise VerlBatchError(f"row {i} has a negative sampling temperature {t}")
        seen.setdefault(1.0 if t < GREEDY_BELOW else float(t), row.trajectory_id or f"row {i}")
    if len(seen) > 1:
        listed = ", ".join(f"{t:g} ({who})" for t, who in sorted(seen.items()))
        raise VerlBatchError(f"rows mix sampling temperatures {listed}; verl scores a batch at one temperature: "
                             "convert each temperature's rows as its own batch")
    return next(iter(seen))


def _split(row: TrainRow, i: int) -> int:
    """Index of the first response token: the first trained token, but never position 0."""
    if any(m not in (0, 1) for m in row.loss_mask):
        raise VerlBatchError(f"row {i} has loss_mask values other than 0 and 1")
    trained = [p for p, m in enumerate(row.loss_mask) if m and p > 0]
    if not trained:
        raise VerlBatchError(f"row {i} ({row.trajectory_id or 'no id'}) has no trained token after position 0; "
                             "drop it before converting (position 0 cannot be predicted)")
    return trained[0]


def _width(name: str, limit: int | None, needs: list[int]) -> int:
    """The padded width: `limit` when fixed (refusing rows that do not fit), else the longest need."""
    worst = max(range(len(needs)), key=needs.__getitem__)
    if limit is not None and needs[worst] > limit:
        raise VerlBatchError(f"row {worst} needs {name} ≥ {needs[worst]}, got {limit}; raise it or pack with a "
                             "smaller max_seq_len")
    return limit if limit is not None else needs[worst]


def rows_to_dataproto(
    rows: Sequence[TrainRow],
    *,
    pad_token_id: int,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
    temperature: float | None = None,
    multi_modal: Callable[[TrainRow], dict[str, Any]] | None = None,
) -> DataProto:
    """One verl `DataProto` for `rows` (layout in the module docstring).

    `max_prompt_len` / `max_response_len` fix the padded widths (verl's ``rollout.prompt_length`` /
    ``response_length``: static shapes); None uses the batch's longest. A row longer than a fixed width is
    refused, not cut: truncation is packing's job, where it is counted. `temperature` is the configured
    sampling temperature, used for rows that did not record theirs. `multi_modal(row)`: a row's images as the
    processor's tensors (a vision-language model); rows with images and no `multi_modal` are refused.
    """
    import numpy as np
    import torch
    from verl import DataProto

    if not rows:
        raise VerlBatchError("no rows to convert: the batch is empty")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or pad_token_id < 0:
        raise VerlBatchError(f"pad_token_id must be a non-negative int, got {pad_token_id!r}")
    temp = scoring_temperature(rows, temperature)
    splits = [_split(row, i) for i, row in enumerate(rows)]
    response_lens = [len(row.tokens) - k for row, k in zip(rows, splits, strict=True)]
    P = _width("max_prompt_len", max_prompt_len, splits)
    R = _width("max_response_len", max_response_len, response_lens)
    B = len(rows)

    prompts = torch.full((B, P), pad_token_id, dtype=torch.int64)
    responses = torch.full((B, R), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((B, P + R), dtype=torch.int64)
    response_mask = torch.zeros((B, R), dtype=torch.int64)
    rollout_lp = torch.zeros((B, R), dtype=torch.float32)
    old_lp = torch.zeros((B, R), dtype=torch.float32)
    advantages = torch.zeros((B, R), dtype=torch.float32)
    for i, (row, k) in enumerate(zip(rows, splits, strict=True)):
        n = len(row.tokens) - k
        prompts[i, P - k:] = torch.tensor(row.tokens[:k], dtype=torch.int64)
        responses[i, :n] = torch.tensor(row.tokens[k:], dtype=torch.int64)
        attention_mask[i, P - k: P + n] = 1
        mask = torch.tensor(row.loss_mask[k:], dtype=torch.int64)
        response_mask[i, :n] = mask
        fmask = mask.to(torch.float32)
        rollout_lp[i, :n] = torch.tensor(row.sampling_logprobs[k:], dtype=torch.float32) * fmask
        old = row.old_logprobs if row.old_logprobs is not None else row.sampling_logprobs
        old_lp[i, :n] = torch.tensor(old[k:], dtype=torch.float32) * fmask
        advantages[i, :n] = torch.tensor(row.advantages[k:], dtype=torch.float32) * fmask
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)

    tensors = {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask, "position_ids": position_ids, "response_mask": response_mask,
        "rollout_log_probs": rollout_lp, "old_log_probs": old_lp, "advantages": advantages,
    }
    non_tensors = {
        "uid": np.array([row.group_id for row in rows], dtype=object),
        "trajectory_id": np.array([row.trajectory_id for row in rows], dtype=object),
    }
    if any(row.images for row in rows):
        if multi_modal is None:
            raise VerlBatchError("rows show images but the model has no processor to turn them into pixel inputs")
        non_tensors["multi_modal_inputs"] = np.array([multi_modal(row) if row.images else {} for row in rows],
                                                     dtype=object)
    meta_info: dict[str, Any] = {
        "temperature": temp, "pad_token_id": pad_token_id, "global_batch_size": B, "mini_batch_size": B,
        "global_token_num": attention_mask.sum(dim=-1).tolist(),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)


def response_tensor_to_row_lists(values_BR: torch.Tensor, data: DataProto, *, fill: float = 0.0
                                 ) -> list[list[float]]:
    """Per-row lists aligned with each row's `tokens` from a response-aligned [B, R] tensor (e.g. the
    ``old_log_probs`` verl's ``compute_log_prob`` returns): `fill` on prompt positions, padding dropped.
    This is the inverse of the response layout, for writing recomputed log-probs back into TrainRows."""
    attention = data.batch["attention_mask"]
    width = data.batch["prompts"].shape[1]
    if values_BR.shape != data.batch["responses"].shape:
        raise VerlBatchError(f"expected a response tensor of shape {tuple(data.batch['responses'].shape)}, "
                             f"got {tuple(values_BR.shape)}")
    out: list[list[float]] = []
    for i in range(values_BR.shape[0]):
        k, n = int(attention[i, :width].sum()), int(attention[i, width:].sum())
        out.append([fill] * k + [float(v) for v in values_BR[i, :n].tolist()])
    return out


def add_rollout_is_weights(data: DataProto, level: str, threshold: str | float) -> dict[str, float]:
    """Put the off-policy correction's weights π_prox/μ (`old_log_probs` recomputed by verl's actor over the
    sampler's `rollout_log_probs`) into `data` as ``rollout_is_weights``, which verl's ``ppo_loss`` multiplies
    into each token's policy loss (as its own ``algorithm.rollout_correction`` does); the correction's metrics,
    under the names the local trainer logs."""
    from rllm_train.algorithms.correction import correction_weights, offpolicy_metrics

    batch = data.batch
    mask = batch["response_mask"].float()
    prox, behaviour = batch["old_log_probs"].float(), batch["rollout_log_probs"].float()
    weights, metrics = correction_weights(prox - behaviour, mask, level, threshold)  # type: ignore[arg-type]
    batch["rollout_is_weights"] = weights  # float32, as the log-probs it came from
    metrics.update(offpolicy_metrics(prox, behaviour, mask))
    return {f"train/rollout_corr/{k}": v for k, v in metrics.items()}
