"""rllm's TrainConfig → verl's own trainer config (``ppo_trainer.yaml`` composed with Hydra), plus pass-through.

Precedence: verl's defaults < rllm's mapping (`verl_overrides`: the loss options of `loss_options`, the model,
GPUs, lengths and batch shape) < `backend_options` (YAML: any verl key, nested as in ``ppo_trainer.yaml``,
e.g. ``backend_options: {actor_rollout_ref: {rollout: {name: sglang, gpu_memory_utilization: 0.6}}}``).
Setting a key rllm maps from one of its options (say ``actor_rollout_ref.actor.clip_ratio_low``) there as well is
refused: two sources for one setting is how a run ends up training another objective than its config.yaml says.
The engine and logging keys in `DEFAULTS_YOU_MAY_CHANGE` are rllm's defaults, not its options, so they may be set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rllm_backends.verl.loss_options import as_hydra_overrides, verl_actor_overrides
from rllm_core.errors import ConfigError
from rllm_train.config import TrainConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["DEFAULTS_YOU_MAY_CHANGE", "compose_trainer_config", "flatten", "verl_overrides"]

DEFAULTS_YOU_MAY_CHANGE = frozenset({"actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode",
                                     "trainer.logger", "trainer.default_local_dir"})
"""verl keys rllm sets that are not one of its own options (the engine, logging): backend_options may set them."""


def verl_overrides(config: TrainConfig, model_path: str, output_dir: str) -> dict[str, Any]:
    """Every verl key rllm sets (dotted from the root of ppo_trainer.yaml)."""
    if config.max_seq_len <= config.max_tokens:
        raise ConfigError(f"--max-seq-len {config.max_seq_len} must exceed --max-tokens {config.max_tokens}: verl "
                          "sizes prompts as max_seq_len − max_tokens")
    out = verl_actor_overrides(config)
    out.update({
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.prompt_length": config.max_seq_len - config.max_tokens,
        "actor_rollout_ref.rollout.response_length": config.max_tokens,
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": config.micro_batch_size * config.max_seq_len,
        "data.max_prompt_length": config.max_seq_len - config.max_tokens,
        "data.max_response_length": config.max_tokens,
        "data.train_batch_size": config.batch_size,
        "trainer.n_gpus_per_node": config.n_gpus,
        "trainer.nnodes": config.nnodes,
        "trainer.device": config.device.split(":", 1)[0],
        "trainer.default_local_dir": os.path.join(output_dir, "verl"),
        "trainer.logger": ["console"],
        "trainer.val_before_train": False,
    })
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1} (leaves: anything that is not a mapping)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def compose_trainer_config(config: TrainConfig, model_path: str, output_dir: str) -> DictConfig:
    """verl's full trainer config for this run (see the module docstring); fails with the key that is wrong."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    ours = verl_overrides(config, model_path, output_dir)
    passed = flatten(config.backend_options)
    for key in DEFAULTS_YOU_MAY_CHANGE:  # rllm's choice, not an rllm option: backend_options may replace it
        if key in passed:
            ours.pop(key, None)
    both = sorted(k for k in passed if k in ours)
    if both:
        raise ConfigError(f"backend_options sets {', '.join(both)}, which rllm already sets from its own options: "
                          "use the rllm option instead (docs/training.md lists the mapping)")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose("ppo_trainer", overrides=as_hydra_overrides(ours))
        OmegaConf.set_struct(cfg, True)  # an unknown pass-through key is an error, not a silent new key
        for key, value in passed.items():
            OmegaConf.update(cfg, key, value, merge=True)
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"verl config: {first} (check backend_options against verl's ppo_trainer.yaml)") from None
    return cfg
