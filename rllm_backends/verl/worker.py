"""verl's own actor training worker (``verl.workers.engine_workers.TrainingWorker`` over verl's FSDP2 engine),
driven with `DataProto` batches: `VerlActorWorker`.

verl 0.9.1 has no ``DataParallelPPOActor``/``fsdp_workers`` any more; the PPO actor is a `TrainingWorker` whose
engine is ``FSDPEngineWithLMHead`` (``verl/workers/engine/fsdp/transformer_impl.py``) and whose loss is
``partial(verl.workers.utils.losses.ppo_loss, config=actor_config)``, built exactly as
``ActorRolloutRefWorker.init_model`` builds it (``verl/workers/engine_workers.py:591-646``). Batches go in the
way verl's trainer sends them (``verl/trainer/ppo/ray_trainer.py:1290-1375``): ``DataProto.to_tensordict`` →
``left_right_2_no_padding`` → ``train_mini_batch`` / ``infer_batch``. The actor config is verl's own
``trainer/config/actor/dp_actor.yaml`` composed with Hydra, then the caller's overrides, then
``omega_conf_to_dataclass`` → ``FSDPActorConfig``.

What runs on a CPU (``device="cpu"``, with `rllm_backends.verl.cpu_platform` installed; checked on verl 0.9.1,
torch 2.13 CPU): building the FSDP2 (``fully_shard``) model on a gloo process group of world size 1, AdamW,
``infer_batch`` (log-probs, entropy), ``train_mini_batch`` (verl's ppo_loss, backward, grad clipping, optimizer
and LR-scheduler step, verl's metrics), ``get_per_tensor_param`` (HF-named full weights), checkpoint save/load
through verl's ``FSDPCheckpointManager``, in this process or inside a Ray actor (`remote_actor_worker`).

Where stock verl stops on a CPU, and what this module does about it:

* no CPU platform: verl falls back to ``nvidia`` (``verl/plugin/platform/platform_manager.py:114-117``) → the
  ``cpu`` platform of `cpu_platform` (registered through verl's ``PlatformRegistry``);
* no engine for ``device="cpu"``: ``ValueError: No engine registered for device='cpu'``
  (``verl/workers/engine/base.py:426``) → `cpu_platform` registers verl's FSDP engine classes for ``cpu``;
* ``initialize_global_process_group_ray`` asks for backend ``"cpu:gloo,cpu:gloo"`` and torch refuses it
  (``ValueError: Duplicate device type cpu in backend string``, ``verl/utils/distributed.py:89/93``) → the
  gloo group is created here first (verl only creates one when none exists);
* ``strategy="fsdp"`` (FSDP1) cannot wrap a CPU module: ``ValueError: The module has CPU parameters or
  buffers when `sync_module_states=True` ...`` (``verl/workers/engine/fsdp/transformer_impl.py:437``) → the
  default strategy here is ``fsdp2``;
* HFModelConfig asks for FlashAttention-2 unless told (``verl/workers/config/model.py:185``) → ``sdpa``;
* not CPU-specific: with trl ≥ 1 installed (rllm depends on trl) ``apply_monkey_patch`` raises ImportError
  (``verl/models/transformers/monkey_patch.py:356``) → `cpu_platform.patch_trl_import`, applied on any
  device.

CPU defaults, all overridable: ``use_remove_padding`` off (padded micro-batches, model-agnostic; on
(packed rows) also works for Llama: transformers 5 splits packed rows by their position_ids under sdpa, the
log-probs agree to 5e-7), no ``torch.compile`` of the entropy, fp32 compute instead of verl's bf16 default
(``fsdp_config.mixed_precision``; bf16 autocast runs on a CPU too).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllm_core.net import free_port

if TYPE_CHECKING:
    import torch
    from verl import DataProto

__all__ = ["CPU_ACTOR_DEFAULTS", "VerlActorWorker", "build_actor_config", "metric_value", "remote_actor_worker"]

ACTOR_PREFIX = "actor_rollout_ref.actor."
MODEL_PREFIX = "actor_rollout_ref.model."

CPU_ACTOR_DEFAULTS: dict[str, Any] = {
    "strategy": "fsdp2",
    "use_torch_compile": False,
    "fsdp_config.use_torch_compile": False,
    "fsdp_config.mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    "ppo_micro_batch_size_per_gpu": 4,
}
"""Actor-config values (relative to ``actor_rollout_ref.actor``) applied on a CPU before the caller's."""


def _split_overrides(overrides: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(actor keys, model keys, ignored keys): keys may be actor-relative (``clip_ratio_low``, ``optim.lr``),
    rooted at ``actor_rollout_ref.actor.`` / ``actor_rollout_ref.model.``, or ``model.<field>``; other rooted
    keys (rollout, algorithm, trainer) concern other parts of verl and are ignored (returned as such), except
    ``trainer.total_training_steps``, which verl's trainer copies into ``optim.total_training_steps``."""
    actor: dict[str, Any] = {}
    model: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in (overrides or {}).items():
        if key == "trainer.total_training_steps":  # verl's trainer copies it into the optimizer's config
            actor.setdefault("optim.total_training_steps", value)
        elif key.startswith(ACTOR_PREFIX):
            actor[key[len(ACTOR_PREFIX):]] = value
        elif key.startswith(MODEL_PREFIX):
            model[key[len(MODEL_PREFIX):]] = value
        elif key.startswith("model."):
            model[key[len("model."):]] = value
        elif key.startswith(("actor_rollout_ref.", "algorithm.", "trainer.", "data.", "critic.", "reward")):
            ignored.append(key)
        else:
            actor[key] = value
    return actor, model, ignored


def _dotted_to_config(values: Mapping[str, Any]) -> Any:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({})
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    return cfg


def build_actor_config(overrides: Mapping[str, Any] | None = None, *, device: str = "cpu") -> Any:
    """verl's ``FSDPActorConfig`` from its own ``actor/dp_actor.yaml`` plus `overrides` (actor-relative dotted
    keys; on a CPU, `CPU_ACTOR_DEFAULTS` go first). ``rollout_n`` is 1: batches arrive already expanded."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="actor/dp_actor").actor
    OmegaConf.set_struct(cfg, False)
    values: dict[str, Any] = {"rollout_n": 1}
    if device == "cpu":
        values.update(CPU_ACTOR_DEFAULTS)
    values.update(overrides or {})
    cfg = OmegaConf.merge(cfg, _dotted_to_config(values))
    return omega_conf_to_dataclass(cfg)


def _ensure_process_group(backend: str) -> bool:
    """Create the process group verl's worker expects, unless one exists; True if created here.

    With no launcher's ``WORLD_SIZE`` > 1 in the environment this is a world of one on 127.0.0.1 and a fresh
    port (an inherited ``MASTER_PORT`` may belong to another process's group). verl's ``Worker`` reads the
    same variables, so they are exported.
    """
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) == 1 and not dist.is_initialized():
        addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR=addr,
                          MASTER_PORT=str(free_port(addr)))
    if dist.is_initialized():
        for key, value in (("RANK", str(dist.get_rank())), ("WORLD_SIZE", str(dist.get_world_size())),
                           ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "0")):
            os.environ.setdefault(key, value)
        return False
    init = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group(backend=backend, init_method=init, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    return True


def metric_value(value: Any) -> float:
    """One of verl's metrics as a float: a Metric, a tensor, or a list of per-micro-batch values (their mean)."""
    if isinstance(value, list | tuple):
        vals = [metric_value(v) for v in value]
        return sum(vals) / len(vals) if vals else float("nan")
    if hasattr(value, "value"):  # verl.utils.metric.Metric
        value = value.value
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


class VerlActorWorker:
    """One verl actor (policy) training worker over the HF model at `model_path`.

    `overrides`: verl actor-config keys, e.g. ``{"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean", "policy_loss.loss_mode": "vanilla",
    "use_kl_loss": False, "kl_loss_coef": 0.0, "kl_loss_type": "low_var_kl", "ppo_micro_batch_size_per_gpu": 2,
    "optim.lr": 1e-6}``; ``model.<field>`` (or ``actor_rollout_ref.model.<field>``) set verl's HFModelConfig.
    ``device="cpu"`` installs the CPU platform; ``"auto"`` leaves verl's own platform detection alone.
    """

    def __init__(self, model_path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None, *,
                 device: str = "cpu") -> None:
        if device not in ("cpu", "auto"):
            raise ValueError(f"device must be 'cpu' or 'auto', got {device!r}")
        from rllm_backends.verl import cpu_platform

        if device == "cpu":
            cpu_platform.install()
        cpu_platform.patch_trl_import()
        from verl.utils.device import get_device_name, get_nccl_backend
        from verl.workers.config import HFModelConfig, TrainingWorkerConfig
        from verl.workers.engine_workers import TrainingWorker
        from verl.workers.utils.losses import ppo_loss

        from rllm_backends.verl import sft_loss  # noqa: F401  (registers --loss sft with verl, in this process)

        self.device = get_device_name()
        actor_over, model_over, self.ignored_overrides = _split_overrides(overrides)
        self.actor_config = build_actor_config(actor_over, device=self.device)
        self._owns_group = _ensure_process_group("gloo" if self.device == "cpu" else get_nccl_backend())

        path = Path(model_path)
        model_kwargs: dict[str, Any] = {
            "path": str(path),
            "load_tokenizer": any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")),
            "use_remove_padding": self.device != "cpu",
            "override_config": {"attn_implementation": "sdpa" if self.device == "cpu" else "flash_attention_2"},
        }
        model_kwargs.update(model_over)
        self.model_config = HFModelConfig(**model_kwargs)
        self.actor_config.model_config = self.model_config

        cfg = self.actor_config
        engine = cfg.engine  # FSDPActorConfig.__post_init__: engine is fsdp_config, with strategy synced
        engine.use_dynamic_bsz = cfg.use_dynamic_bsz
        engine.max_token_len_per_gpu = cfg.ppo_max_token_len_per_gpu
        engine.micro_batch_size_per_gpu = cfg.ppo_micro_batch_size_per_gpu
        engine.infer_max_token_len_per_gpu = cfg.ppo_infer_max_token_len_per_gpu
        engine.infer_micro_batch_size_per_gpu = (cfg.ppo_infer_micro_batch_size_per_gpu
                                                 or cfg.ppo_micro_batch_size_per_gpu)
        engine.use_remove_padding = self.model_config.use_remove_padding

        self.worker = TrainingWorker(TrainingWorkerConfig(
            model_type="language_model", model_config=self.model_config, engine_config=engine,
            optimizer_config=cfg.optim, checkpoint_config=cfg.checkpoint))
        self.worker.reset()  # builds model, FSDP2 wrapping, optimizer and LR scheduler
        self.worker.set_loss_fn(partial(ppo_loss, config=cfg))
        self.pad_token_id = int(getattr(self.model_config.hf_config, "pad_token_id", None) or 0)

    # ---- batches -------------------------------------------------------------------------------------------

    def _tensordict(self, data: DataProto, **defaults: Any) -> Any:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        td = left_right_2_no_padding(data.to_tensordict())
        base = {"temperature": 1.0, "pad_token_id": self.pad_token_id}
        for key, value in {**base, **defaults}.items():
            if key not in td.keys():  # noqa: SIM118 (TensorDict has no `in` for keys)
                tu.assign_non_tensor(td, **{key: value})
        return td

    def update(self, data: DataProto) -> dict[str, float]:
        """One call of verl's ``train_mini_batch`` on `data` (one optimizer step per mini-batch; by default the
        whole batch is one mini-batch) → verl's metrics as floats (lists averaged): ``loss``,
        ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``grad_norm`` (before clipping), ``lr``...,
        plus ``update_seconds``."""
        from verl.utils import tensordict_utils as tu

        cfg = self.actor_config
        size = len(data)
        td = self._tensordict(
            data, calculate_entropy=bool(cfg.calculate_entropy or cfg.entropy_coeff != 0.0),
            distillation_use_topk=False, distillation_only=False, global_batch_size=size, mini_batch_size=size,
            epochs=cfg.ppo_epochs, seed=cfg.data_loader_seed, dataloader_kwargs={"shuffle": cfg.shuffle},
            compute_loss=True)
        start = time.perf_counter()
        output = self.worker.train_mini_batch(td)
        seconds = time.perf_counter() - start
        metrics = {key: metric_value(val) for key, val in tu.get(output, "metrics").items()}
        metrics["update_seconds"] = seconds
        return metrics

    def compute_log_prob(self, data: DataProto, *, with_entropy: bool = True) -> DataProto:
        """verl's ``infer_batch`` on `data`: a DataProto with ``old_log_probs`` (and ``entropys``), [B, R]
        response-aligned and padded like ``responses`` (verl's ``_compute_old_log_prob``)."""
        from verl import DataProto
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._tensordict(data, calculate_entropy=with_entropy, compute_loss=False)
        output = self.worker.infer_batch(td)
        result = {"old_log_probs": no_padding_2_padding(tu.get(output, "log_probs"), td).float()}
        if with_entropy:
            result["entropys"] = no_padding_2_padding(tu.get(output, "entropy"), td).float()
        return DataProto.from_dict(tensors=result)

    # ---- weights -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF-named weights on the CPU (verl's ``engine.get_per_tensor_param``: what it sends a rollout)."""
        params, _ = self.worker.engine.get_per_tensor_param()
        return {name: tensor.detach().to("cpu").clone() for name, tensor in params}

    def save(self, path: str | os.PathLike[str], global_step: int = 0) -> None:
        """verl's FSDP checkpoint (model, optimizer, extra state) under `path`."""
        self.worker.save_checkpoint(str(path), global_step=global_step)

    def load(self, path: str | os.PathLike[str]) -> None:
        self.worker.load_checkpoint(str(path), del_local_after_load=False)

    def close(self) -> None:
        import torch.distributed as dist

        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False


def remote_actor_worker(model_path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None, *,
                        num_cpus: float = 1) -> Any:
    """A `VerlActorWorker` inside a Ray actor holding `num_cpus` CPUs (Ray must be initialised): call its
    methods with ``.remote`` and ``ray.get``. The actor's ``import verl`` selects the CPU platform through
    ``VERL_PLATFORM`` / ``VERL_USE_EXTERNAL_MODULES`` (`cpu_platform.ray_env_vars`)."""
    import ray

    from rllm_backends.verl.cpu_platform import ray_env_vars

    env = {**ray_env_vars(), "MASTER_ADDR": "127.0.0.1"}
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if key in os.environ:
            env[key] = os.environ[key]
    cls = ray.remote(num_cpus=num_cpus, runtime_env={"env_vars": env})(VerlActorWorker)
    return cls.remote(str(model_path), dict(overrides or {}), device="cpu")
