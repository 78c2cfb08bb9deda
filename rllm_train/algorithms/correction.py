"""Off-policy correction: importance weights between the policy the trainer scores against and the one that sampled.

Rows carry the sampler's logprobs (the behaviour policy μ). When the trainer recomputes them (`--recompute-old-
logprobs`: the proximal policy π_prox), the two differ by the sampler/trainer mismatch (bf16 or quantised serving,
another engine's numerics) and, in asynchronous training, by the policy versions the sampler lagged behind. The
correction multiplies each token's policy loss by a weight w built from the log-ratio r = log π_prox − log μ
(verl 0.9 `rollout_corr_helper.compute_rollout_correction_weights`; the equality is pinned by tests):

- level ``token``: w_t = exp(clamp(r_t, ±20)); level ``sequence``: w_t = exp(clamp(Σ_t r_t, ±20)) for every
  token of the row;
- truncated IS (TIS, a threshold "C"): w ← min(w, C);
- masked IS (IcePop, a threshold "L_U"): w ← w where L ≤ w ≤ U, else 0;
- weights are zero off the mask and carry no gradient (they change the measure, not the objective).

With the PPO loss this is decoupled PPO (AReaL; verl's "decoupled" rollout correction): the clipped ratio is taken
against π_prox, the weight carries π_prox / μ. `offpolicy_metrics` are the diagnostics verl logs (mismatch KL in
k1 and k3, χ² at token and sequence level, weight mean/max/min, the fractions truncated or masked).
"""

from __future__ import annotations

from typing import Literal

import torch

from rllm_core.errors import ConfigError
from rllm_train.algorithms.names import parse_threshold

__all__ = ["SAFETY_BOUND", "IsLevel", "correction_weights", "mismatch_metrics", "offpolicy_metrics", "parse_threshold"]

SAFETY_BOUND = 20.0
IsLevel = Literal["token", "sequence"]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1e-8)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1e-8)


def correction_weights(log_ratio_BT: torch.Tensor, mask_BT: torch.Tensor, level: IsLevel = "token",
                       threshold: str | float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weights [B, T] (detached) and their metrics, for log_ratio = log π_prox − log μ (module docstring)."""
    if level not in ("token", "sequence"):
        raise ConfigError(f"importance-weight level {level!r}: token or sequence")
    upper, lower = parse_threshold(threshold)
    mask = mask_BT.to(log_ratio_BT.dtype)
    if level == "token":
        raw_BT = torch.exp(torch.clamp(log_ratio_BT, -SAFETY_BOUND, SAFETY_BOUND))
        log_for_metrics = log_ratio_BT
    else:
        log_for_metrics = (log_ratio_BT * mask).sum(-1, keepdim=True)
        raw_BT = torch.exp(torch.clamp(log_for_metrics, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio_BT)
    raw_BT = raw_BT * mask
    if lower is None:
        weights_BT = raw_BT.clamp(max=upper)
        kept_BT = torch.ones_like(raw_BT, dtype=torch.bool)
    else:
        kept_BT = (raw_BT >= lower) & (raw_BT <= upper)
        weights_BT = torch.where(kept_BT, raw_BT, torch.zeros_like(raw_BT))
    low = lower if lower is not None else 1.0 / upper
    metrics = {"is_mean": float(_masked_mean(weights_BT, mask))}
    if level == "sequence":
        metrics["is_max"] = float(torch.exp(torch.clamp(log_for_metrics.max(), max=SAFETY_BOUND)))
        metrics["is_min"] = float(torch.exp(log_for_metrics.min()))
        metrics["is_fraction_high"] = float((log_for_metrics > torch.log(torch.tensor(upper))).float().mean())
        metrics["is_fraction_low"] = float((log_for_metrics < torch.log(torch.tensor(low))).float().mean())
    else:
        on = mask.bool()
        metrics["is_max"] = float(weights_BT.masked_fill(~on, float("-inf")).max())
        metrics["is_min"] = float(weights_BT.masked_fill(~on, float("inf")).min())
        metrics["is_fraction_high"] = float(_masked_mean((raw_BT > upper).float(), mask))
        metrics["is_fraction_low"] = float(_masked_mean((raw_BT < low).float(), mask))
    if lower is not None:
        metrics["is_fraction_masked"] = float(_masked_mean((~kept_BT).float(), mask))
    return weights_BT.detach(), metrics


def offpolicy_metrics(prox_BT: torch.Tensor, behaviour_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """The mismatch between π_prox and μ on the sampled tokens: KL(μ‖π_prox) as k1 and k3, χ² per token and per
    sequence, and the log-perplexity gap (verl's `compute_offpolicy_metrics`, named the same without its prefix)."""
    mask = mask_BT.to(prox_BT.dtype)
    log_ratio = prox_BT - behaviour_BT
    seq_prox_B = _masked_mean(prox_BT, mask, -1)
    seq_behaviour_B = _masked_mean(behaviour_BT, mask, -1)
    log_ppl_diff_B = seq_behaviour_B - seq_prox_B
    safe = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    seq_sum_B = torch.clamp((log_ratio * mask).sum(-1), -SAFETY_BOUND, SAFETY_BOUND)
    gap = mismatch_metrics(prox_BT, behaviour_BT, mask_BT)
    return {
        "kl": gap["mismatch_kl"],
        "k3_kl": gap["mismatch_k3_kl"],
        "chi2_token": float(_masked_mean(torch.exp(safe).square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq_sum_B).mean() - 1.0),
        "log_ppl_diff": float(log_ppl_diff_B.mean()),
        "log_ppl_abs_diff": float(log_ppl_diff_B.abs().mean()),
    }


def mismatch_metrics(trainer_BT: torch.Tensor, sampler_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """KL(μ‖π) between the sampler's log-probs μ and the trainer's π on the sampled tokens, before this step's
    update (rllm takes one optimizer step per batch, so every micro-batch's forward is pre-update): as k1 (the
    log-ratio's mean, verl's `rollout_corr/kl`) and k3 (non-negative). It is the sampler/trainer numerics gap (a bf16
    server, another engine) plus, in asynchronous runs, the versions the sampler lagged; logged every step so a
    faster sampler's cost is measured, and `--rollout-is` corrects it."""
    mask = mask_BT.to(trainer_BT.dtype)
    log_ratio = trainer_BT - sampler_BT
    return {"mismatch_kl": float(_masked_mean(-log_ratio, mask)),
            "mismatch_k3_kl": float(_masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask))}
