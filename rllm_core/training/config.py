"""One typed config for a training run: the same names on the CLI (`--group-size`) and in YAML/TOML
(`group_size:`); the file is read first and flags override it. Saved as `config.yaml` in the run directory."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rllm_core.algorithms.names import AGG_MODES, ESTIMATORS, LOSSES, REJECTION_MODES, requires_groups
from rllm_core.errors import ConfigError

__all__ = ["TrainConfig", "load_config"]


class TrainConfig(BaseModel):
    """Everything `rllm train` needs. Field docs are the CLI help."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    # what to train on
    benchmark: str = "arithmetic"
    agent: str | None = None
    """'module:function' rollout to train instead of the benchmark's default agent."""
    workflow: Literal["default", "none"] = "default"
    """'default': the benchmark grades each episode; 'none': the agent scores itself (Episode.reward or
    artifacts['reward']) and the benchmark only supplies tasks."""
    train_split: str = "train"
    val_split: str = "test"
    data_dir: str | None = None
    max_train_examples: int | None = None
    # model + backend
    model: str = "smollm2-135m"
    backend: str = "local"
    device: str = "cpu"
    bf16: bool = False
    """bf16 autocast for forward/backward; master weights and optimizer stay fp32."""
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    lora_alpha: int = 16
    # algorithm
    algo: str | dict[str, str] = "grpo"
    """Advantage estimator, or a map role → estimator (YAML only), '*' the fallback role."""
    loss: str = "ppo"
    agg: str = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_c: float = 3.0
    kl_coef: float = 0.0
    kl_type: Literal["k1", "k3"] = "k3"
    rejection: str = "none"
    recompute_old_logprobs: bool = False
    """Use the trainer's own logprobs (one extra forward pass) instead of the sampler's as π_old."""
    # batch shape
    group_size: int = Field(4, ge=1)
    batch_size: int = Field(8, ge=1)
    """Tasks per step; each is attempted group_size times."""
    micro_batch_size: int = Field(8, ge=1)
    max_seq_len: int = Field(1024, ge=8)
    overlong: Literal["truncate", "drop"] = "truncate"
    # sampling
    temperature: float = Field(1.0, ge=0)
    top_p: float = 1.0
    max_tokens: int = Field(64, ge=1)
    concurrency: int = 32
    episode_timeout_s: float | None = None
    # optimiser
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    max_grad_norm: float = 1.0
    # run
    max_steps: int = Field(20, ge=0)
    max_minutes: float | None = None
    """Wall-clock budget: stop after the step that crosses it (then checkpoint and final validation)."""
    seed: int = 0
    output: str = "runs/latest"
    eval_every: int = 0
    """Validate on the held-out split every N steps (0: only before and after)."""
    eval_examples: int = 64
    eval_attempts: int = Field(1, ge=1)
    """Sampled attempts per held-out task (more attempts: a less noisy sampled accuracy)."""
    eval_greedy: bool = False
    """Also validate with greedy decoding (temperature 0)."""
    save_every: int = 10
    keep_checkpoints: int = 2
    save_episodes: bool = True

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        estimators = [self.algo] if isinstance(self.algo, str) else list(self.algo.values())
        for est in estimators:
            if est not in ESTIMATORS:
                raise ValueError(f"algo {est!r} is not an estimator; choose one of {', '.join(ESTIMATORS)}")
            if requires_groups(est) and self.group_size < 2:
                raise ValueError(
                    f"algo {est!r} compares attempts within a group, but group_size={self.group_size}: "
                    "use --group-size 2 or more, or --algo reinforce"
                )
        for name, value, allowed in (("loss", self.loss, LOSSES), ("agg", self.agg, AGG_MODES),
                                     ("rejection", self.rejection, REJECTION_MODES)):
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not known; choose one of {', '.join(allowed)}")
        if self.workflow == "none" and not self.agent:
            raise ValueError("workflow 'none' runs your agent as the whole episode: pass --agent module:function")
        return self

    def dump_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False), encoding="utf-8")


def _read_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = tomllib.loads(p.read_text()) if p.suffix == ".toml" else yaml.safe_load(p.read_text())
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {p} is not valid {'TOML' if p.suffix == '.toml' else 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of option names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Config from a YAML/TOML file (optional), then `overrides` (None values are ignored); errors say which
    option was wrong and why."""
    data = _read_file(path) if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("invalid training config:\n" + "\n".join(lines)) from None
