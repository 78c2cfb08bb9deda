"""rllm's loss and optimiser options → verl 0.9 config overrides, refusing what verl cannot do exactly.

The result of `verl_actor_overrides` is a flat dict of **dotted keys from the root of verl's
``ppo_trainer.yaml``** (``"actor_rollout_ref.actor.clip_ratio_low"``, ...): the form Hydra overrides take, so
`as_hydra_overrides` turns it into ``key=value`` strings for ``verl.trainer.main_ppo`` and a test can
compose verl's real config with it. Mapping (verl key under ``actor_rollout_ref.actor`` unless noted):

========================== =========================================================================
rllm option                verl
========================== =========================================================================
loss ppo / gspo / sft      policy_loss.loss_mode "vanilla" (dual-clip PPO) / "gspo" / "rllm_sft" (sft_loss.py)
clip_low, clip_high        clip_ratio_low, clip_ratio_high
clip_c                     clip_ratio_c (dual clip; verl's gspo ignores it, as ours does)
agg                        loss_agg_mode (same names); seq-mean-token-sum-norm: loss_scale_factor = max_tokens
kl_coef, kl_type k1 / k3   use_kl_loss (kl_coef > 0), kl_loss_coef, kl_loss_type "kl" / "low_var_kl";
                           algorithm.use_kl_in_reward false (rllm's KL is a loss term only)
micro_batch_size           ppo_micro_batch_size_per_gpu, rollout/ref log_prob_micro_batch_size_per_gpu
batch_size, group_size     ppo_mini_batch_size (prompts; verl multiplies it by rollout.n), rollout.n;
                           ppo_epochs 1: one optimizer step per batch, as rllm does
lr, weight_decay           optim.lr, optim.weight_decay (verl's default decay is 0.01, ours 0: always set)
max_grad_norm              optim.clip_grad (the engine reads this; the actor-level grad_clip is read by nothing)
warmup_steps, lr_schedule  optim.lr_warmup_steps, optim.lr_scheduler_type (constant | cosine);
max_steps                  trainer.total_training_steps (verl copies it into optim.total_training_steps)
bf16                       fsdp_config.mixed_precision param_dtype bf16 / fp32: verl's FSDP engine computes
                           in bf16 unless told (``transformer_impl.py:397``), rllm in fp32 unless --bf16
gradient_checkpointing     actor_rollout_ref.model.enable_gradient_checkpointing (verl's default is true)
lora_rank, lora_alpha      actor_rollout_ref.model.lora_rank, lora_alpha
temperature, top_p         actor_rollout_ref.rollout.temperature, top_p (verl's trainer overwrites the
                           batch's meta_info temperature with rollout.temperature, ray_trainer.py:1331)
(none)                     entropy_coeff 0 (rllm has no entropy bonus)
========================== =========================================================================

Refused (ConfigError naming the option): ``loss importance_sampling`` (verl 0.9.1 registers no −A·ρ loss:
``gpg`` is −A·log π and ``bypass_mode``/reinforce −A·log π·sg(ρ): the same gradient, a different loss, and
truncated / renormalised weights), ``lr_schedule linear`` (verl has constant and cosine only).

``seq-mean-token-sum-norm`` is mapped, not refused: verl 0.9.1's ``agg_loss`` divides by the global batch
size *and* by ``loss_scale_factor`` (``core_algos.py:1181-1193``), i.e. Σ L·M / (B · T_norm) — the same as
ours once T_norm is the same constant, so we pin it to max_tokens (our local trainer's `norm_tokens`). Older
verl divided by T_norm only (a loss B times ours); that is what the note in rllm_train.algorithms.losses
describes. ``recompute_old_logprobs`` is no actor option: it decides what `rows_to_dataproto` puts in
``old_log_probs``. Do not emulate it with verl's ``algorithm.rollout_correction.bypass_mode``: that replaces
policy_loss.loss_mode by "bypass_mode" (``rollout_corr_helper.py:1144``), which runs vanilla PPO even for gspo.
GSPO differs from ours only where a token's |log π − log π_old| > 20: we clamp it before the sequence mean,
verl does not (``core_algos.py:1578``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rllm_core.errors import ConfigError
from rllm_train.config import TrainConfig

__all__ = ["ADDED_KEYS", "SUPPORTED", "as_hydra_overrides", "check_verl_version", "verl_actor_overrides"]

SUPPORTED = ">=0.9,<0.10"
"""verl versions whose batch layout, loss functions and config keys this backend was checked against."""

_ACTOR = "actor_rollout_ref.actor."
_LOSS_MODES = {"ppo": "vanilla", "gspo": "gspo", "sft": "rllm_sft"}
"""Our loss → verl's policy_loss.loss_mode; `rllm_sft` is registered with verl by sft_loss.py."""
_KL_TYPES = {"k1": "kl", "k3": "low_var_kl"}
_SCHEDULES = {"constant": "constant", "cosine": "cosine"}

ADDED_KEYS = frozenset({_ACTOR + "fsdp_config.mixed_precision"})
"""Keys verl's dataclasses have but its YAML does not list: Hydra must be told to add them (``+key=``)."""


def check_verl_version(version: str) -> Version:
    """The parsed `version` when it is inside SUPPORTED, else ConfigError: verl reshapes its worker API and
    config between minor versions (0.9 dropped ``dp_actor``), so an unchecked version fails late and obscurely.
    Pre-releases inside the range (0.9.2rc1) are accepted; 0.10 pre-releases are not."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ConfigError(f"verl version {version!r} is not a valid version; rllm's verl backend needs verl "
                          f"{SUPPORTED}") from None
    if not SpecifierSet(SUPPORTED).contains(parsed, prereleases=True):
        raise ConfigError(f"verl {version} is not supported; rllm's verl backend needs verl {SUPPORTED} "
                          f"(pip install 'verl{SUPPORTED}')")
    return parsed


def _refuse(option: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"{option} {value!r} cannot run on the verl backend: {why}")


def verl_actor_overrides(config: TrainConfig) -> dict[str, Any]:
    """verl overrides (dotted keys from the root of verl's ppo_trainer config; see the module docstring)
    that make verl train with `config`'s loss, aggregation, KL, batch shape and optimiser."""
    if config.loss not in _LOSS_MODES:
        raise _refuse("loss", config.loss, "verl 0.9 has no plain importance-sampling loss (−A·ρ); its gpg and "
                      "bypass_mode/reinforce losses differ in value and weighting; use --loss ppo or gspo")
    if config.lr_schedule not in _SCHEDULES:
        raise _refuse("lr_schedule", config.lr_schedule, "verl's optimiser schedules are constant and cosine")
    dtype = "bf16" if config.bf16 else "fp32"
    mb = config.micro_batch_size
    out: dict[str, Any] = {
        _ACTOR + "policy_loss.loss_mode": _LOSS_MODES[config.loss],
        _ACTOR + "clip_ratio_low": config.clip_low,
        _ACTOR + "clip_ratio_high": config.clip_high,
        _ACTOR + "clip_ratio_c": config.clip_c,
        _ACTOR + "loss_agg_mode": config.agg,
        _ACTOR + "loss_scale_factor": config.max_tokens if config.agg == "seq-mean-token-sum-norm" else None,
        _ACTOR + "entropy_coeff": 0.0,
        _ACTOR + "use_kl_loss": config.kl_coef > 0,
        _ACTOR + "kl_loss_coef": config.kl_coef,
        _ACTOR + "kl_loss_type": _KL_TYPES[config.kl_type],
        _ACTOR + "ppo_mini_batch_size": config.batch_size,
        _ACTOR + "ppo_micro_batch_size_per_gpu": mb,
        # any row count: verl splits micro-batches by a token budget (fixed ones need the rows per rank to divide
        # evenly), and the loss is normalised by the whole batch's token count either way
        _ACTOR + "use_dynamic_bsz": True,
        _ACTOR + "ppo_max_token_len_per_gpu": mb * config.max_seq_len,
        _ACTOR + "ppo_epochs": 1,
        _ACTOR + "shuffle": False,
        _ACTOR + "optim.lr": config.lr,
        _ACTOR + "optim.weight_decay": config.weight_decay,
        _ACTOR + "optim.clip_grad": config.max_grad_norm,
        _ACTOR + "optim.lr_warmup_steps": config.warmup_steps,
        _ACTOR + "optim.lr_scheduler_type": _SCHEDULES[config.lr_schedule],
        _ACTOR + "optim.min_lr_ratio": 0.0,
        _ACTOR + "fsdp_config.mixed_precision": {"param_dtype": dtype, "reduce_dtype": "fp32",
                                                 "buffer_dtype": "fp32"},
        "actor_rollout_ref.rollout.n": config.group_size,
        "actor_rollout_ref.rollout.temperature": config.temperature,
        "actor_rollout_ref.rollout.top_p": config.top_p,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": mb,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": mb,
        "actor_rollout_ref.model.enable_gradient_checkpointing": config.gradient_checkpointing,
        "actor_rollout_ref.model.lora_rank": config.lora_rank,
        "actor_rollout_ref.model.lora_alpha": config.lora_alpha,
        "algorithm.use_kl_in_reward": False,
        "trainer.total_training_steps": max(config.max_steps, 1),
    }
    return out


def _hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar (null, true/false, numbers, quoted strings, {k: v} dicts)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {value!r} as a Hydra override value")


def as_hydra_overrides(overrides: Mapping[str, Any]) -> list[str]:
    """``key=value`` strings for verl's Hydra entry point (``+key=value`` for ADDED_KEYS)."""
    return [f"{'+' if key in ADDED_KEYS else ''}{key}={_hydra_value(value)}" for key, value in overrides.items()]
