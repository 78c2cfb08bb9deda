"""The `verl` backend: rllm's rows, advantages and loss options, trained by verl's own workers on Ray.

Two placements, one seam:

- ``--device cuda`` (a GPU cluster): verl's hybrid engine (`VerlGpuCluster`): the actor/rollout worker group
  on Ray, its vLLM/SGLang replicas as the run's gateway upstreams (token ids injected), verl's checkpoint
  engine for weight sync; `before_rollouts` wakes the replicas, `after_rollouts` frees their memory.
- ``--device cpu`` (this laptop, CI): verl's `TrainingWorker` over its FSDP2 engine in a Ray actor on the CPU
  platform (`cpu_platform`); rollouts sample from rllm's local policy server, which takes the actor's
  HF-named weights after each update (verl has no CPU inference engine).

Either way `train_step` converts rows with `rows_to_dataproto` and returns a Future (the update runs while the
loop writes the step's episodes), and `save`/`load` keep verl's own checkpoint inside rllm's checkpoint
directory, so `--resume` works as for the local backend.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_backends.verl.batch import add_rollout_is_weights
from rllm_core.errors import ConfigError, TrainingError
from rllm_train.algorithms.names import AGG_MODES
from rllm_train.backend import BackendBase, BackendCapabilities, PolicyEndpoint, TrainStepResult
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

__all__ = ["VerlBackend", "require_verl"]

log = logging.getLogger("rllm.verl")

STATE_FILE = "verl_backend.json"
_CPU_KEYS = ("actor_rollout_ref.actor.", "actor_rollout_ref.model.")
"""The backend_options verl's CPU actor takes (it has no rollout engine, trainer or data section)."""
ACTOR_DIR = "verl_actor"


def require_verl() -> str:
    """verl's version, checked against the supported range; ConfigError naming the extra when it is missing."""
    from importlib.metadata import PackageNotFoundError, version

    from rllm_backends.verl.loss_options import check_verl_version

    try:
        found = version("verl")
    except PackageNotFoundError:
        raise ConfigError("the verl backend needs verl: pip install \"rllm[verl]\" (docs/training.md has a fast "
                          "--no-deps install for CPU-only machines)") from None
    check_verl_version(found)
    return found


class VerlBackend(BackendBase):
    """Backend protocol over verl (see the module docstring). Built by the plugin's factory from the config:
    verl's presence, version and every loss option are checked there, before the run directory is written."""

    name = "verl"

    def __init__(self, config: TrainConfig) -> None:
        from rllm_backends.verl.loss_options import verl_actor_overrides

        self.verl_version = require_verl()
        self.config = config
        _resolve_device(config)
        self.placement = config.device.split(":", 1)[0]
        if self.placement not in ("cpu", "cuda"):
            raise ConfigError(f"--device {config.device}: the verl backend runs on cpu or cuda")
        self.overrides = verl_actor_overrides(config)  # refuses what verl cannot honour, by option name
        self.policy_version = 0
        self.steps_done = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rllm-verl-update")
        self._actor: Any = None  # CPU: the Ray actor of VerlActorWorker
        self._server: Any = None  # CPU: rllm's policy server
        self._cluster: Any = None  # GPU: VerlGpuCluster
        self._ray: Any = None
        self.tokenizer: Any = None
        self.processor: Any = None
        self.pad_token_id = 0

    def capabilities(self) -> BackendCapabilities:
        gpu = self.placement == "cuda"
        return BackendCapabilities(
            losses=frozenset({"ppo", "gspo", "sft"}), agg_modes=frozenset(AGG_MODES), kl_types=frozenset(),
            lora=gpu, recompute_old_logprobs=not gpu, devices=frozenset({"cpu", "cuda"}), async_train_step=True,
            colocated=gpu, multi_gpu=gpu, async_rollouts=not gpu, rollout_is=not gpu, images=gpu,
            notes={"loss": "verl 0.9 has no plain importance-sampling loss",
                   "images": "rows' images go to verl as multi_modal_inputs on its GPU path (--device cuda), where "
                             "its vision-language recipes run; its CPU path is not tried with one",
                   "kl_type": "the verl backend computes no reference log-probs yet (verl's ppo_loss needs "
                              "ref_log_prob); the mapping onto use_kl_loss / kl_loss_type is tested, the reference "
                              "worker is not wired",
                   "lora_rank": "LoRA runs on verl's GPU path only (--device cuda)",
                   "recompute_old_logprobs": "on verl's GPU path π_old is the sampler's (rollout_log_probs)",
                   "rollout_is": "on verl's GPU path π_prox is not recomputed (see recompute_old_logprobs); on CPU "
                                 "the weights go to verl's ppo_loss as its rollout_is_weights",
                   "max_staleness": "verl's GPU path is colocated (the hybrid engine's replicas sleep while the "
                                    "actor trains); a disaggregated placement (verl's fully_async_policy) is not "
                                    "wired; on CPU the actor trains in its Ray process while the policy server "
                                    "samples"})

    # ------------------------------------------------------------------ setup
    def setup(self, config: TrainConfig) -> None:
        from rllm_serve.models import load_tokenizer, model_dir

        self.config = config
        path = model_dir(config.model)
        self.model_path = path
        self.tokenizer = load_tokenizer(path) if Path(path).is_dir() else None
        self.processor = _vision_processor(path)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else getattr(self.tokenizer, "eos_token_id", 0) or 0)
        self._connect_ray()
        if self.placement == "cpu":
            self._setup_cpu(path)
        else:
            self._setup_gpu(path)

    def _connect_ray(self) -> None:
        """Join the run's Ray (connected for --rollout-workers), or connect --ray-address (an existing cluster,
        multi-node), or start a local one for the run; what this backend connects, it disconnects."""
        from rllm_rollout.distributed import connect_ray
        from rllm_rollout.distributed.ray_cluster import import_ray

        if not import_ray().is_initialized():
            self._ray = connect_ray(self.config.ray_address)
            self._ray.__enter__()

    def _setup_cpu(self, path: str) -> None:
        from rllm_backends.verl.config import flatten
        from rllm_backends.verl.worker import remote_actor_worker
        from rllm_serve import load_model, start_policy_server

        passed = flatten(self.config.backend_options)
        overrides = {**self.overrides, **passed}  # actor/model keys apply here
        ignored = sorted(k for k in passed if not k.startswith(_CPU_KEYS))
        if ignored:
            log.warning("verl on CPU trains with verl's actor only: backend_options %s do not apply here",
                        ", ".join(ignored))
        self._actor = remote_actor_worker(path, overrides, num_cpus=1)
        self._server = start_policy_server(load_model(path), max_batch_size=64, own_model=True)
        self.policy_version = int(self._server.policy_version)

    def _setup_gpu(self, path: str) -> None:
        from rllm_backends.verl.config import compose_trainer_config
        from rllm_backends.verl.gpu_cluster import VerlGpuCluster

        cfg = compose_trainer_config(self.config, path, self.config.output)
        self._cluster = VerlGpuCluster(cfg, seed=self.config.seed)
        self._cluster.sync(0)  # the replicas load the actor's weights: version 0 is served

    def _require(self) -> None:
        if self._actor is None and self._cluster is None:
            raise TrainingError("the verl backend is not set up: call setup(config) first")

    # ------------------------------------------------------------------ rollouts
    def policy_endpoint(self) -> PolicyEndpoint:
        self._require()
        if self._cluster is not None:
            urls = self._cluster.server_urls
            return PolicyEndpoint(base_url=urls[0], model=self.model_path, policy_version=self.policy_version,
                                  tokenizer=self.tokenizer, replicas=urls, inject_token_ids=True)
        return PolicyEndpoint(base_url=self._server.base_url, model=self._server.model_name,
                              policy_version=self.policy_version, tokenizer=self.tokenizer, exact_turns=True)

    def before_rollouts(self) -> None:
        if self._cluster is not None:
            self._cluster.wake()

    def after_rollouts(self) -> None:
        if self._cluster is not None:
            self._cluster.sleep()

    # ------------------------------------------------------------------ update
    def train_step(self, rows: Sequence[TrainRow]) -> TrainStepResult:
        self._require()
        from rllm_backends.verl.batch import rows_to_dataproto

        data = rows_to_dataproto(list(rows), pad_token_id=self.pad_token_id, temperature=self.config.temperature,
                                 multi_modal=self._pixels if self.processor is not None else None)
        return self._pool.submit(self._update, data, list(rows))

    def _pixels(self, row: TrainRow) -> dict[str, Any]:
        """A row's images as its processor's tensors: verl's `multi_modal_inputs` for that row."""
        from rllm_serve.vision import BadImage, pixel_inputs

        try:
            return pixel_inputs(self.processor, row.images)
        except BadImage as exc:
            raise TrainingError(f"a training row's image cannot be read again: {exc}") from None

    def _update(self, data: Any, rows: list[TrainRow]) -> dict[str, float]:
        import ray

        correction: dict[str, float] = {}
        try:
            if self.config.recompute_old_logprobs:
                correction = self._recompute_old_logprobs(data)
            raw = self._cluster.update(data) if self._cluster is not None else ray.get(self._actor.update.remote(data))
        except ray.exceptions.RayError as exc:
            raise TrainingError(f"verl's update failed: {_last_line(exc)}") from None
        self.steps_done += 1
        return {**_rename_metrics(raw, rows), **correction}

    def _recompute_old_logprobs(self, data: Any) -> dict[str, float]:
        """π_old from verl's actor into `data` (and, with --rollout-is, the correction's weights); the
        correction's metrics."""
        import ray

        old = ray.get(self._actor.compute_log_prob.remote(data, with_entropy=False))
        data.batch["old_log_probs"] = old.batch["old_log_probs"] * data.batch["response_mask"]
        if self.config.rollout_is == "none":
            return {}
        return add_rollout_is_weights(data, self.config.rollout_is, self.config.rollout_is_threshold)

    def sync_weights(self) -> int:
        self._require()
        return self._push_weights(version=self.policy_version + 1)

    def _push_weights(self, version: int) -> int:
        """verl's weight sync (GPU), or the actor's HF-named weights into the policy server (CPU)."""
        if self._cluster is not None:
            self._cluster.sync(self.steps_done)
            self.policy_version = version
        else:
            import ray

            state = ray.get(self._actor.state_dict.remote())
            self.policy_version = int(self._server.update_weights(state, version=version))
        return self.policy_version

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Path) -> None:
        self._require()
        import ray

        actor_dir = Path(path) / ACTOR_DIR
        if self._cluster is not None:
            self._cluster.save(str(actor_dir), self.steps_done)
        else:
            ray.get(self._actor.save.remote(str(actor_dir), self.steps_done))
        state = {"policy_version": self.policy_version, "steps_done": self.steps_done, "model": self.config.model,
                 "verl": self.verl_version, "placement": self.placement}
        (Path(path) / STATE_FILE).write_text(json.dumps(state), encoding="utf-8")

    def load(self, path: Path) -> None:
        self._require()
        import ray

        state_file = Path(path) / STATE_FILE
        if not state_file.is_file():
            raise TrainingError(f"checkpoint {path} has no {STATE_FILE}; it was not written by the verl backend")
        state = json.loads(state_file.read_text(encoding="utf-8"))
        if state.get("placement", self.placement) != self.placement:
            raise ConfigError(f"checkpoint {path} was trained with --device {state['placement']}; resume with it")
        actor_dir = str(Path(path) / ACTOR_DIR)
        if self._cluster is not None:
            self._cluster.load(actor_dir)
        else:
            ray.get(self._actor.load.remote(actor_dir))
        self.steps_done = int(state["steps_done"])
        self._push_weights(version=int(state["policy_version"]))  # the run goes on from the saved version

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._actor is not None:
            import ray

            if ray.is_initialized():  # else Ray was stopped by its owner, and the actor with it
                try:
                    ray.get(self._actor.close.remote(), timeout=30)
                    ray.kill(self._actor)
                except Exception as exc:  # the actor may already be gone; shutting down goes on
                    log.debug("verl actor close: %r", exc)
            self._actor = None
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
        if self._ray is not None:
            self._ray.__exit__(None, None, None)
            self._ray = None


def _resolve_device(config: TrainConfig) -> None:
    """`rllm train gsm8k --backend verl --n-gpus 8` means the GPU path: without an explicit --device, verl runs
    on cuda when GPUs were asked for (--n-gpus / --nnodes) or torch sees one, else on the CPU. The choice is
    written into the config (and so into the run's config.yaml), so a --resume keeps it."""
    if "device" in config.model_fields_set:
        return
    asked = bool({"n_gpus", "nnodes"} & config.model_fields_set)
    if not asked:
        try:
            import torch

            asked = torch.cuda.is_available()
        except ImportError:
            asked = False
    config.device = "cuda" if asked else "cpu"
    if asked:
        log.info("verl backend: --device cuda (GPUs asked for or visible); pass --device cpu to train on the CPU")


_RENAMES = {"actor/pg_loss": "train/pg_loss", "actor/pg_clipfrac": "train/clip_frac", "actor/ppo_kl": "train/approx_kl",
            "actor/pg_clipfrac_lower": "train/clip_frac_lower", "actor/kl_loss": "train/kl", "grad_norm":
            "train/grad_norm", "actor/grad_norm": "train/grad_norm", "loss": "train/loss", "lr": "train/lr",
            "actor/lr": "train/lr", "update_seconds": "time/train_step_s"}
"""verl's metric names → the local backend's, so curves compare across backends; others are kept as verl/…"""


def _rename_metrics(raw: dict[str, Any], rows: list[TrainRow]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in raw.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        out[_RENAMES.get(key, key if key.startswith(("train/", "time/")) else f"verl/{key}")] = number
    out["train/rows"] = float(len(rows))
    out["train/trained_tokens"] = float(sum(sum(r.loss_mask[1:]) for r in rows))
    return out


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _vision_processor(path: str) -> Any:
    """The processor of a vision-language model directory (its rows' images become pixel inputs); None else."""
    if not Path(path).is_dir():
        return None
    from rllm_serve.vision_models import is_vision_dir

    if not is_vision_dir(path, local_only=True):
        return None
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, local_files_only=True)
