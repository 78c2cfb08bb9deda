"""Policy losses and loss aggregation, token-level, in pure torch.

Axes: B rows (sequences), T tokens. `logprobs_BT` are the trainer's log-probs of the sampled tokens (with
grad), `old_logprobs_BT` those the tokens were sampled with, `mask_BT` 1 on trained (completion) tokens,
`advantages` [B] or [B, T]. Semantics follow verl 0.9 `core_algos`:

- ``ppo`` (vanilla, dual-clip): ρ = exp(clamp(logπ − logπ_old, −20, 20));
  L1 = −A·ρ, L2 = −A·clip(ρ, 1−ε_low, 1+ε_high), L = max(L1, L2); for A < 0 also L = min(L, −A·c) (dual clip,
  c = `clip_c` > 1). clip fraction = mean over tokens of [L2 > L1].
- ``importance_sampling``: L = −A·ρ (no clipping; tinker's `importance_sampling` loss).
- ``gspo``: sequence ratio s_i = exp(mean_t(logπ − logπ_old)) (clamped at log 10), carried per token as
  exp(logπ − sg(logπ) + sg(log s_i)), then the PPO clip with ε_low/ε_high, aggregated by the `agg` you pass
  (as verl 0.9.1 does). We clamp each token's log-ratio at ±20 before the mean; verl does not (it matters only
  past |log-ratio| > 20).
- ``sft``: L = −A·logπ, the cross-entropy of the row's tokens weighted by A (`rllm sft` gives its rows A = 1 on
  the assistant tokens: the negative log-likelihood; Tinker's built-in cross_entropy with A as its weights). No
  ratio, no clip: what the tokens were sampled with does not matter.

Aggregation (`agg`), with M the mask:
- ``token-mean``            Σ L·M / Σ M                                   (verl default; DAPO)
- ``seq-mean-token-sum``    mean_i Σ_t L·M                                 (sum per sequence, mean over rows)
- ``seq-mean-token-mean``   mean_i (Σ_t L·M / Σ_t M)                       (original GRPO)
- ``seq-mean-token-sum-norm`` Σ_i Σ_t L·M / (B · T_norm), T_norm = `norm_tokens` or T   (Dr. GRPO)
  (we divide by B as well as T_norm, so the gradient scale, and thus the learning rate, does not depend on the
  batch size; verl 0.9.1's `agg_loss` does the same with `loss_scale_factor` = T_norm, older verl divided by
  T_norm only. tests/test_verl_losses.py pins the equality.)

`token_denominator` / `seq_denominator` replace the local Σ M / row count so that gradient accumulation over
micro-batches gives exactly the full-batch loss.

KL to a reference (optional, `ref_logprobs_BT` and `kl_coef` > 0): ``k1`` = logπ − logπ_ref; ``k3``
(verl's low_var_kl) = exp(r) − r − 1 with r = logπ_ref − logπ clamped to [−20, 20], then clamped to [−10, 10]; added as
kl_coef · agg(kl).
"""

from __future__ import annotations

from typing import Literal

import torch

from rllm_core.errors import ConfigError
from rllm_train.algorithms.names import AGG_MODES, LOSSES

__all__ = ["AGG_MODES", "LOSSES", "agg_loss", "kl_penalty", "policy_loss", "policy_loss_with_metrics"]

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    agg: str = "token-mean",
    *,
    token_denominator: float | None = None,
    seq_denominator: float | None = None,
    norm_tokens: float | None = None,
) -> torch.Tensor:
    """Reduce a token loss [B, T] to a scalar by `agg` (see the module docstring)."""
    mask_BT = mask_BT.to(loss_BT.dtype)
    if agg == "token-mean":
        denom = token_denominator if token_denominator is not None else mask_BT.sum().clamp(min=1)
        return (loss_BT * mask_BT).sum() / denom
    seq_has_tokens_B = (mask_BT.sum(-1) > 0).to(loss_BT.dtype)
    n_seqs = seq_denominator if seq_denominator is not None else seq_has_tokens_B.sum().clamp(min=1)
    if agg == "seq-mean-token-sum":
        return (loss_BT * mask_BT).sum(-1).mul(seq_has_tokens_B).sum() / n_seqs
    if agg == "seq-mean-token-mean":
        per_seq_B = (loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)
        return per_seq_B.mul(seq_has_tokens_B).sum() / n_seqs
    if agg == "seq-mean-token-sum-norm":
        horizon = norm_tokens if norm_tokens is not None else loss_BT.shape[-1]
        rows = seq_denominator if seq_denominator is not None else loss_BT.shape[0]
        return (loss_BT * mask_BT).sum() / (rows * horizon)
    raise ConfigError(f"unknown loss aggregation {agg!r}; choose one of {', '.join(AGG_MODES)}")


def kl_penalty(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate between the policy and a reference (k1 or k3 = verl's low_var_kl)."""
    if kind == "k1":
        return logprobs_BT - ref_logprobs_BT
    if kind == "k3":
        # the log-ratio is clamped before exp, as verl's low_var_kl does: exp of a huge ratio is inf, and inf × a
        # zero mask is NaN in the backward pass even at positions the mask drops
        log_ratio = (ref_logprobs_BT - logprobs_BT).clamp(-20, 20)
        return (torch.exp(log_ratio) - log_ratio - 1).clamp(-10, 10)
    raise ConfigError(f"unknown KL estimator {kind!r}; choose k1 or k3")


def policy_loss_with_metrics(
    name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
    *,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    token_denominator: float | None = None,
    seq_denominator: float | None = None,
    norm_tokens: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss (scalar, with grad) and its metrics: pg_loss, clip_frac, clip_frac_lower, approx_kl, kl.
    `is_weights` [B, T] (detached; `correction.correction_weights`) scale each token's policy loss before
    aggregation, as verl's `rollout_is_weights` do: off-policy correction, decoupled PPO with the PPO loss."""
    if name not in LOSSES:
        raise ConfigError(f"unknown policy loss {name!r}; choose one of {', '.join(LOSSES)}")
    if clip_c <= 1.0:
        raise ConfigError(f"clip_c (dual-clip constant) must be > 1, got {clip_c}")
    mask = mask.to(logprobs.dtype)
    adv_BT = advantages.to(logprobs.dtype)
    if adv_BT.dim() == 1:
        adv_BT = adv_BT.unsqueeze(-1)
    adv_BT = adv_BT.expand_as(logprobs)
    agg_kw = {"token_denominator": token_denominator, "seq_denominator": seq_denominator, "norm_tokens": norm_tokens}

    log_ratio_BT = torch.clamp(logprobs - old_logprobs, -20.0, 20.0)
    approx_kl = _masked_mean(-log_ratio_BT, mask).detach()
    zero = torch.zeros((), dtype=logprobs.dtype)
    clip_frac_lower = zero
    if name == "gspo":
        seq_len_B = mask.sum(-1).clamp(min=1)
        seq_log_ratio_B = (log_ratio_BT * mask).sum(-1) / seq_len_B
        log_seq_ratio_BT = logprobs - logprobs.detach() + seq_log_ratio_B.detach().unsqueeze(-1)
        ratio_BT = torch.exp(torch.clamp(log_seq_ratio_BT, max=10.0))
    else:
        ratio_BT = torch.exp(log_ratio_BT)

    loss1_BT = -adv_BT * ratio_BT
    if name == "sft":
        loss_BT, clip_frac = -adv_BT * logprobs, zero
    elif name == "importance_sampling":
        loss_BT, clip_frac = loss1_BT, zero
    else:
        loss2_BT = -adv_BT * torch.clamp(ratio_BT, 1.0 - clip_low, 1.0 + clip_high)
        clipped_BT = torch.maximum(loss1_BT, loss2_BT)
        clip_frac = _masked_mean((loss2_BT > loss1_BT).to(mask.dtype), mask).detach()
        if name == "ppo":
            loss3_BT = -adv_BT * clip_c
            dual_BT = torch.minimum(loss3_BT, clipped_BT)
            clip_frac_lower = _masked_mean(((clipped_BT > loss3_BT) & (adv_BT < 0)).to(mask.dtype), mask).detach()
            loss_BT = torch.where(adv_BT < 0, dual_BT, clipped_BT)
        else:
            loss_BT = clipped_BT

    if is_weights is not None:
        loss_BT = loss_BT * is_weights.to(loss_BT.dtype).detach()
    pg_loss = agg_loss(loss_BT, mask, agg, **agg_kw)
    total = pg_loss
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "clip_frac": float(clip_frac),
        "clip_frac_lower": float(clip_frac_lower),
        "approx_kl": float(approx_kl),
    }
    if ref_logprobs is not None and kl_coef > 0:
        kl = agg_loss(kl_penalty(logprobs, ref_logprobs, kl_type), mask, agg, **agg_kw)
        total = total + kl_coef * kl
        metrics["kl"] = float(kl.detach())
    return total, metrics


def policy_loss(
    name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
    **options: object,
) -> torch.Tensor:
    """The scalar policy loss only; see `policy_loss_with_metrics` for the formulas and metrics."""
    loss, _ = policy_loss_with_metrics(
        name, logprobs, old_logprobs, advantages, mask, agg, clip_low, clip_high, clip_c, **options  # type: ignore[arg-type]
    )
    return loss
