"""`--loss sft` on verl: −A·logπ, registered in verl's own policy-loss registry (`register_policy_loss`) as
`rllm_sft`, so verl's `ppo_loss` runs it inside its actor like any of its losses (aggregation, rollout weights and
the global batch scaling are verl's). With `rllm sft`'s rows (A = 1 on the assistant tokens) it is their negative
log-likelihood; the local trainer computes the same (rllm_train.algorithms.losses, `sft`), and
tests/test_verl_backend.py checks the two agree on the same rows.

Importing this module registers the loss; the verl worker imports it in whichever process runs the actor.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

__all__ = ["SFT_LOSS_MODE", "sft_policy_loss"]

SFT_LOSS_MODE = "rllm_sft"


@register_policy_loss(SFT_LOSS_MODE)
def sft_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                    rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    losses = -advantages * log_prob
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights
    batch_info = getattr(config, "global_batch_info", None) or {}
    loss = agg_loss(loss_mat=losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
    mask = response_mask.to(log_prob.dtype)
    kl = ((old_log_prob - log_prob).detach() * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": float(kl), "actor/pg_clipfrac_lower": 0.0}
