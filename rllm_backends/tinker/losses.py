"""How each of our loss options runs on Tinker, exactly.

Two ways to train on Tinker:

- **built-in** (`TrainingClient.forward_backward(datums, loss_fn, loss_fn_config)`): the server computes the loss.
  Tinker's RL losses SUM a per-token term over every target token of every datum (docs, "Loss Functions"):
  ``importance_sampling`` −Σ ρ·A; ``ppo`` −Σ min(ρ·A, clip(ρ, lo, hi)·A); ``cispo`` −Σ sg(clip(ρ, lo, hi))·A·logπ,
  ρ = exp(logπ − logπ_sampling), lo/hi = ``clip_low_threshold`` / ``clip_high_threshold`` (absolute ratios, so
  ours map to 1 − clip_low and 1 + clip_high). Each term is positively homogeneous in A, so scaling row i's
  advantages by s_i > 0 gives exactly Σ_i s_i Σ_t L_it, and the scales below turn that sum into our `agg`:

  ==========================  =======================================================
  token-mean                  s_i = 1 / Σ M                (trained tokens, whole batch)
  seq-mean-token-sum          s_i = 1 / R                  (R rows with a trained token)
  seq-mean-token-mean         s_i = 1 / (T_i · R)          (T_i trained tokens of row i)
  seq-mean-token-sum-norm     s_i = 1 / (R · max_tokens)   (the local trainer's norm_tokens)
  ==========================  =======================================================

  (a row without trained tokens gets 0). Our ``--loss importance_sampling`` is −A·ρ, so it runs as Tinker's
  built-in; the only difference is that we clamp the log-ratio at ±20 before exp (it matters only past that).
- **custom** (`TrainingClient.forward_backward_custom(datums, loss_fn)`): Tinker does a forward pass, hands the
  client the per-datum logprobs (with grad), the client computes any loss on them and Tinker back-propagates its
  gradient. Our ``ppo`` (dual clip, clip_c) and ``gspo`` run this way through `make_custom_loss`, which calls our
  `policy_loss_with_metrics` on the whole batch as one micro-batch with the local trainer's denominators — the
  same numbers the local trainer computes. A KL term (kl_coef > 0) needs the reference policy's logprobs, which
  only the custom path can use (`LossPlan.needs_ref_logprobs`).

A backend option ``loss_fn`` (``backend_options: {tinker: {loss_fn: cispo}}``) asks for one of Tinker's built-ins
by name instead, with Tinker's semantics (its ``ppo`` has no dual clip), thresholds from our clip_low/clip_high,
overridable with ``loss_fn_config``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from rllm_backends.tinker.datum import behaviour_logprobs
from rllm_core.errors import ConfigError, TrainingError
from rllm_train.algorithms import policy_loss_with_metrics
from rllm_train.algorithms.names import AGG_MODES
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

if TYPE_CHECKING:
    from tinker import types

__all__ = ["BUILTIN_LOSSES", "LossPlan", "agg_scales", "builtin_metrics", "custom_metrics", "make_custom_loss",
           "plan_loss"]

BUILTIN_LOSSES: dict[str, frozenset[str]] = {
    "importance_sampling": frozenset(),
    "ppo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
    "cispo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
}
"""Tinker built-ins `loss_fn` may name, with the `loss_fn_config` keys each takes."""

_NOT_OFFERED = {
    "dro": "its β·(logπ − logπ_sampling)² penalty applies to every target token, prompt and observation tokens "
           "included (Tinker's RL losses take no mask), and it does not scale with the advantage, so neither the "
           "loss mask nor --agg can be honoured",
    "gspo": "its sequence ratio's masking and clip settings are not documented for this SDK; use --loss gspo "
            "(ours, run exactly through forward_backward_custom)",
    "stable_reinforce": "its inputs and loss_fn_config are not documented for this SDK, so it cannot be checked "
                        "against our masking and --agg",
    "cross_entropy": "it is the supervised loss (no advantages)",
    "custom": "it is what forward_backward_custom uses internally; our own losses take that path by themselves",
}

CustomLossFn = Callable[[list["types.Datum"], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


def _trained(row: TrainRow) -> int:
    """Trained target tokens of a row (position 0 is never a target)."""
    return sum(row.loss_mask[1:])


def agg_scales(rows: Sequence[TrainRow], agg: str, norm_tokens: float) -> list[float]:
    """Per-row advantage scales that make Tinker's token SUM equal our `agg` over the whole batch."""
    if agg not in AGG_MODES:
        raise ConfigError(f"unknown loss aggregation {agg!r}; choose one of {', '.join(AGG_MODES)}")
    counts = [_trained(r) for r in rows]
    total, n_rows = sum(counts), sum(1 for c in counts if c > 0)
    if total == 0:
        raise TrainingError("no trainable tokens in this batch (every row has loss mask 0); step skipped")
    if agg == "token-mean":
        per = [1.0 / total] * len(rows)
    elif agg == "seq-mean-token-sum":
        per = [1.0 / n_rows] * len(rows)
    elif agg == "seq-mean-token-mean":
        per = [1.0 / (c * n_rows) if c else 0.0 for c in counts]
    else:  # seq-mean-token-sum-norm
        per = [1.0 / (n_rows * norm_tokens)] * len(rows)
    return [s if c > 0 else 0.0 for s, c in zip(per, counts, strict=True)]


@dataclass(frozen=True)
class LossPlan:
    """How one step's loss runs on Tinker.

    kind "builtin": `forward_backward(rows_to_datums(rows, plan.scales(rows)), plan.loss_fn, plan.loss_fn_config)`.
    kind "custom": `forward_backward_custom(rows_to_datums(rows), make_custom_loss(rows, config, ref))`.
    """

    kind: Literal["builtin", "custom"]
    loss_fn: str
    """Tinker's loss name for `forward_backward` ("custom" on the custom path)."""
    loss_fn_config: dict[str, float] | None
    agg: str
    norm_tokens: float
    """The horizon of seq-mean-token-sum-norm (the local trainer passes --max-tokens)."""
    needs_ref_logprobs: bool = False
    """kl_coef > 0: pass the reference policy's logprobs of each row to `make_custom_loss`."""
    needs_old_logprobs: bool = False
    """--recompute-old-logprobs on a built-in loss: fill each row's `old_logprobs` with the current policy's
    logprobs (a forward pass) before `rows_to_datums`; the custom path recomputes them itself."""
    description: str = field(default="", compare=False)

    def scales(self, rows: Sequence[TrainRow], config: TrainConfig | None = None) -> list[float]:
        """Per-row advantage scales for `rows_to_datums`: the agg factors (built-in), 1.0 (custom: the loss
        function aggregates itself). `config`, when given, must be the one the plan was made from (checked)."""
        if config is not None and (config.agg, float(config.max_tokens)) != (self.agg, self.norm_tokens):
            raise TrainingError(f"loss plan made for agg {self.agg!r} / max_tokens {self.norm_tokens:g}, asked to "
                                f"scale for {config.agg!r} / {config.max_tokens}; make a new plan with plan_loss")
        if self.kind == "custom":
            return [1.0] * len(rows)
        return agg_scales(rows, self.agg, self.norm_tokens)


def _thresholds(config: TrainConfig, name: str) -> dict[str, float]:
    if config.clip_low > 1.0:
        raise ConfigError(f"clip_low {config.clip_low} > 1 makes Tinker's {name} clip_low_threshold "
                          f"(1 − clip_low) negative; use clip_low ≤ 1")
    return {"clip_low_threshold": 1.0 - config.clip_low, "clip_high_threshold": 1.0 + config.clip_high}


def _builtin_config(name: str, config: TrainConfig, override: Any) -> dict[str, float] | None:
    allowed = BUILTIN_LOSSES[name]
    cfg = _thresholds(config, name) if allowed else {}
    if override is not None:
        if not isinstance(override, Mapping):
            raise ConfigError(f"backend option loss_fn_config must be a mapping, got {type(override).__name__}")
        for key, value in override.items():
            if key not in allowed:
                keys = ", ".join(sorted(allowed)) or "none"
                raise ConfigError(f"backend option loss_fn_config: Tinker's {name} takes no key {key!r} "
                                  f"(it takes: {keys})")
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"backend option loss_fn_config.{key} must be a finite number, got {value!r}")
            cfg[key] = float(value)
    if "clip_low_threshold" in cfg and not 0 <= cfg["clip_low_threshold"] <= cfg["clip_high_threshold"]:
        raise ConfigError(f"Tinker's {name} needs 0 ≤ clip_low_threshold ≤ clip_high_threshold, got "
                          f"{cfg['clip_low_threshold']} and {cfg['clip_high_threshold']}")
    return cfg or None


def plan_loss(config: TrainConfig, options: Mapping[str, Any] | None = None) -> LossPlan:
    """The plan for `config.loss` / `config.agg` / `config.kl_coef`, or for the Tinker built-in that the backend
    option `loss_fn` names. Raises ConfigError for a name Tinker lacks or a setting a built-in cannot honour."""
    options = options or {}
    common = {"agg": config.agg, "norm_tokens": float(config.max_tokens)}
    name = options.get("loss_fn")
    if name is None:
        if "loss_fn_config" in options:
            raise ConfigError("backend option loss_fn_config is only used with loss_fn (a Tinker built-in loss)")
        if config.loss == "sft" and config.kl_coef == 0:  # −Σ w·logπ with w = A·scale on trained tokens
            return LossPlan("builtin", "cross_entropy", None, description="ours = Tinker's cross_entropy (−w·logπ, "
                            "weights = advantages), agg by weight scales", **common)
        if config.loss == "importance_sampling" and config.kl_coef == 0:
            return LossPlan("builtin", "importance_sampling", None, needs_old_logprobs=config.recompute_old_logprobs,
                            description="ours = Tinker's importance_sampling (−A·ρ), agg by advantage scales",
                            **common)
        return LossPlan("custom", "custom", None, needs_ref_logprobs=config.kl_coef > 0,
                        description=f"our {config.loss} loss via forward_backward_custom", **common)
    if name not in BUILTIN_LOSSES:
        if isinstance(name, str) and name in _NOT_OFFERED:
            raise ConfigError(f"backend option loss_fn {name!r} is not offered: {_NOT_OFFERED[name]}. Choose one of "
                              f"{', '.join(BUILTIN_LOSSES)}, or leave loss_fn unset to run --loss {config.loss}")
        raise ConfigError(f"backend option loss_fn {name!r} is not a Tinker RL loss; choose one of "
                          f"{', '.join(BUILTIN_LOSSES)} (or leave it unset to run --loss {config.loss})")
    if config.kl_coef > 0:
        raise ConfigError(f"kl_coef {config.kl_coef} cannot be added to Tinker's built-in {name} loss (it has no KL "
                          "term); set kl_coef 0, or leave loss_fn unset to run our loss with the KL term")
    return LossPlan("builtin", name, _builtin_config(name, config, options.get("loss_fn_config")),
                    needs_old_logprobs=config.recompute_old_logprobs,
                    description=f"Tinker's built-in {name} (Tinker's semantics), agg by advantage scales", **common)


def _pad(rows_values: Sequence[Sequence[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros((len(rows_values), width), dtype=dtype)
    for i, v in enumerate(rows_values):
        out[i, : len(v)] = torch.as_tensor(list(v), dtype=dtype)
    return out


def _masked(values: Sequence[float], row: TrainRow) -> list[float]:
    """Target-aligned values of a row with 0.0 where the target token is not trained."""
    return [float(v) if m else 0.0 for v, m in zip(values, row.loss_mask[1:], strict=True)]


def _shifted_ref(ref: Sequence[float | None], row: TrainRow, index: int) -> list[float]:
    """A row's reference logprobs as targets 1..N−1: accepts them token-aligned (len N, as
    SamplingClient.compute_logprobs returns, entry 0 None) or already shifted (len N − 1)."""
    n = len(row.tokens)
    if len(ref) == n:
        ref = ref[1:]
    elif len(ref) != n - 1:
        raise TrainingError(f"reference logprobs of train row {index} have {len(ref)} entries for {n} tokens; give "
                            f"{n} (token-aligned) or {n - 1} (one per target)")
    out = []
    for t, (lp, m) in enumerate(zip(ref, row.loss_mask[1:], strict=True)):
        if m and (lp is None or not math.isfinite(lp)):
            raise TrainingError(f"reference logprob of train row {index}, token {t + 1} is {lp} on a trained token")
        out.append(float(lp) if m and lp is not None else 0.0)
    return out


def make_custom_loss(
    rows: Sequence[TrainRow], config: TrainConfig, ref_logprobs: Sequence[Sequence[float | None]] | None = None
) -> CustomLossFn:
    """Our policy loss as a `forward_backward_custom` loss function for the datums `rows_to_datums(rows)`.

    The function receives Tinker's per-datum logprob tensors (length len(tokens) − 1, target-aligned, with grad),
    pads them to [B, T] and returns `policy_loss_with_metrics(config.loss, ...)` with the local trainer's
    conventions for one micro-batch holding the whole batch: denominators Σ trained tokens and rows with a trained
    token, norm_tokens = max_tokens, π_old the row's old_logprobs (else sampling_logprobs) or, with
    --recompute-old-logprobs, the logprobs themselves (ratio 1).
    """
    rows = list(rows)
    for i, row in enumerate(rows):
        if len(row.tokens) < 2:
            raise TrainingError(f"train row {i} has {len(row.tokens)} token(s); a Tinker datum needs at least 2")
    token_denom = float(sum(_trained(r) for r in rows))
    seq_denom = float(sum(1 for r in rows if _trained(r) > 0))
    if token_denom == 0:
        raise TrainingError("no trainable tokens in this batch (every row has loss mask 0); step skipped")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ConfigError(f"kl_coef {config.kl_coef} needs the reference policy's logprobs of every row; pass "
                          "ref_logprobs (or set kl_coef 0)")
    if ref_logprobs is not None and len(ref_logprobs) != len(rows):
        raise TrainingError(f"{len(ref_logprobs)} reference logprob lists for {len(rows)} train rows")
    lengths = [len(r.tokens) - 1 for r in rows]
    width = max(lengths)
    f64 = torch.float64
    mask_BT = _pad([r.loss_mask[1:] for r in rows], width, f64)
    # untrained positions get 0.0 (not value × 0: an inf there would turn into NaN)
    old_BT = _pad([_masked(behaviour_logprobs(r)[1:], r) for r in rows], width, f64)
    adv_BT = _pad([_masked(r.advantages[1:], r) for r in rows], width, f64)
    ref_BT = (None if ref_logprobs is None or config.kl_coef == 0
              else _pad([_shifted_ref(ref, r, i) for i, (ref, r) in enumerate(zip(ref_logprobs, rows, strict=True))],
                        width, f64))
    if not bool(torch.isfinite(old_BT).all()) or not bool(torch.isfinite(adv_BT).all()):
        raise TrainingError("a trained token has a non-finite old logprob or advantage; check the sampler's "
                            "logprobs and the rewards")

    def loss_fn(data: list[types.Datum], logprobs_list: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        if len(data) != len(rows) or len(logprobs_list) != len(rows):
            raise TrainingError(f"custom loss built for {len(rows)} rows got {len(data)} datums and "
                                f"{len(logprobs_list)} logprob tensors; pass rows_to_datums(rows) in the same order")
        for i, (lp, n) in enumerate(zip(logprobs_list, lengths, strict=True)):
            if tuple(lp.shape) != (n,):
                raise TrainingError(f"datum {i}: Tinker returned logprobs of shape {tuple(lp.shape)}, expected ({n},)")
        logp_BT = torch.nn.utils.rnn.pad_sequence(list(logprobs_list), batch_first=True, padding_value=0.0)
        dtype = logp_BT.dtype
        old = logp_BT.detach() if config.recompute_old_logprobs else old_BT.to(dtype)
        return policy_loss_with_metrics(
            config.loss, logp_BT, old, adv_BT.to(dtype), mask_BT.to(dtype), config.agg, config.clip_low,
            config.clip_high, config.clip_c, ref_logprobs=None if ref_BT is None else ref_BT.to(dtype),
            kl_coef=config.kl_coef, kl_type=config.kl_type, token_denominator=token_denom,
            seq_denominator=seq_denom, norm_tokens=float(config.max_tokens))

    return loss_fn


def _train_keys(metrics: Mapping[str, float], rows: Sequence[TrainRow]) -> dict[str, float]:
    out = {f"train/{k}": float(v) for k, v in metrics.items()}
    out["train/rows"] = float(sum(1 for r in rows if _trained(r) > 0))
    out["train/trained_tokens"] = float(sum(_trained(r) for r in rows))
    return out


def custom_metrics(rows: Sequence[TrainRow], output: types.ForwardBackwardOutput) -> dict[str, float]:
    """The local trainer's train/* keys from a `forward_backward_custom` output (our loss's metrics travel in
    `output.metrics`; Tinker's "loss:sum" there is our loss's value)."""
    ours = {k: v for k, v in output.metrics.items()
            if k in ("pg_loss", "clip_frac", "clip_frac_lower", "approx_kl", "kl")}
    if "loss:sum" in output.metrics:
        ours["loss"] = float(output.metrics["loss:sum"])
    return _train_keys(ours, rows)


def builtin_metrics(rows: Sequence[TrainRow], output: types.ForwardBackwardOutput, plan: LossPlan | None = None
                    ) -> dict[str, float]:
    """The local trainer's train/* keys from a built-in `forward_backward` output: loss (Tinker's "loss:sum",
    which the advantage scales made our aggregated loss) and, from the returned per-datum target logprobs,
    approx_kl (mean over trained tokens of logπ_old − logπ) and clip_frac (share of trained tokens whose clipped
    term is the active one: ppo's −A·clip(ρ) > −A·ρ, cispo's ρ outside the thresholds; 0 for importance_sampling).
    Pass the step's `plan` (without it the loss is taken for importance_sampling). A `forward_backward_custom`
    output (its metrics carry our pg_loss) is handed to `custom_metrics`, so one call serves both paths.
    """
    if "pg_loss" in output.metrics:  # a forward_backward_custom output: our loss reported its own metrics
        return custom_metrics(rows, output)
    loss = float(output.metrics.get("loss:sum", math.nan))
    metrics: dict[str, float] = {"loss": loss, "pg_loss": loss}
    sft = plan is not None and plan.loss_fn == "cross_entropy"  # no ratio: nothing to compare the logprobs with
    if not sft and len(output.loss_fn_outputs) == len(rows) and all("logprobs" in o for o in output.loss_fn_outputs):
        cfg = (plan.loss_fn_config if plan is not None else None) or {}
        name = plan.loss_fn if plan is not None else "importance_sampling"
        default_lo, default_hi = (0.0, 4.0) if name == "cispo" else (0.8, 1.2)
        lo, hi = cfg.get("clip_low_threshold", default_lo), cfg.get("clip_high_threshold", default_hi)
        n_tok, kl_sum, clipped = 0, 0.0, 0
        for row, out in zip(rows, output.loss_fn_outputs, strict=True):
            new = out["logprobs"].tolist()
            olds = behaviour_logprobs(row)
            for t, m in enumerate(row.loss_mask[1:]):
                if not m:
                    continue
                log_ratio = max(-20.0, min(20.0, new[t] - olds[t + 1]))
                ratio, adv = math.exp(log_ratio), row.advantages[t + 1]
                n_tok += 1
                kl_sum += -log_ratio
                if name == "ppo":
                    clipped += int(-adv * min(max(ratio, lo), hi) > -adv * ratio)
                elif name == "cispo":
                    clipped += int(ratio < lo or ratio > hi)
        if n_tok:
            metrics["approx_kl"] = kl_sum / n_tok
            metrics["clip_frac"] = clipped / n_tok
            metrics["clip_frac_lower"] = 0.0
    return _train_keys(metrics, rows)
