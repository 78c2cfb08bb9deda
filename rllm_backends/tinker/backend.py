"""The `tinker` backend: rllm's rollouts and rewards here, the update and the sampling on the Tinker service.

Per step, through the v2 seam:

- rollouts call a local OpenAI-compatible server (`server.start_tinker_sampling_server`) whose engine answers
  with the service's current `SamplingClient`: token ids and logprobs come straight from the samples, so the
  gateway records `token_source="server"` Steps, exactly as against vLLM;
- `train_step(rows)` converts rows to `tinker.types.Datum`s and submits `forward_backward` (a built-in loss, or
  `forward_backward_custom` with rllm's own loss where the built-ins cannot express it: `losses.plan_loss`),
  `optim_step` and a short-lived `save_state` snapshot back to back, before it returns (the service pipelines
  them while the loop writes the step's episodes); the task it returns awaits them (`update.py`);
- `sync_weights()` saves the weights for sampling and swaps the server's client (requests already running
  finish on the client they started with);
- `save`/`load` keep the service's own state path (weights and optimizer) in rllm's checkpoint directory, so
  `--resume` works as for the local backend; each checkpoint also names its sampler weights, which
  `rllm eval --backend tinker --model RUN_DIR` samples from.

A failed step is never resubmitted on the same training client (its optimizer step may already have run, or a
custom loss has poisoned it): the client is rebuilt from the snapshot taken after the previous step and the step
is retried there (`update.py`). When the retries are spent, the weights are those of the last finished step, the
step raises TrainingError, and the loop writes a resumable checkpoint of that step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_backends.tinker.options import TinkerOptions
from rllm_backends.tinker.update import SNAPSHOT_TTL_S, StepFailed, StepUpdate
from rllm_core.errors import ConfigError, TrainingError
from rllm_train.algorithms.names import AGG_MODES, LOSSES
from rllm_train.backend import (
    BackendBase,
    BackendCapabilities,
    PolicyEndpoint,
    TrainStepResult,
    parse_backend_options,
)
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

__all__ = ["DEFAULT_LORA_RANK", "STATE_FILE", "TinkerBackend", "check_base_model", "read_checkpoint"]

log = logging.getLogger("rllm.tinker")

STATE_FILE = "tinker_backend.json"
DEFAULT_LORA_RANK = 32
"""Tinker trains LoRA adapters only; --lora-rank 0 (rllm's 'full fine-tuning' default) means this rank."""
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8
"""torch.optim.AdamW's defaults, which the local trainer uses (Tinker's own defaults differ: beta2 0.95, eps 1e-12)."""


def check_base_model(service: Any, model: str, need: str = "trainable") -> int | None:
    """The model's context length; ConfigError listing the service's models that are `need` when it is not."""
    from rllm_backends.tinker.retry import call_with_retries
    from rllm_backends.tinker.sdk import rest_client

    caps = call_with_retries(lambda: rest_client(service).get_server_capabilities().result(),
                             what="get_server_capabilities")
    models = {m.model_name: m for m in caps.supported_models if m.model_name}
    found = models.get(model)
    if found is None or getattr(found, need) is False:
        offered = sorted(n for n, m in models.items() if getattr(m, need) is not False)
        verb = "trains" if need == "trainable" else "samples from"
        raise ConfigError(f"--model {model!r} is not a base model the Tinker service {verb}; it offers: "
                          f"{', '.join(offered) or 'none'}")
    return found.max_context_length


class TinkerBackend(BackendBase):
    """Backend protocol over the Tinker SDK (see the module docstring)."""

    name = "tinker"

    def __init__(self, config: TrainConfig) -> None:
        from rllm_backends.tinker.losses import plan_loss
        from rllm_backends.tinker.sdk import require_api_key, require_tinker

        require_api_key()  # one line naming the variable, before anything loads
        self.tinker_version = require_tinker()
        self.config = config
        self.options: dict[str, Any] = parse_backend_options(TinkerOptions, config.backend_options, "tinker"
                                                             ).model_dump(exclude_none=True)
        self.plan = plan_loss(config, self.options)  # refuses a loss option Tinker cannot express, by name
        if config.temperature != 1.0:
            raise ConfigError(f"--temperature {config.temperature}: the Tinker service scores tokens at temperature "
                              "1, so rows sampled at another temperature would train with wrong importance ratios; "
                              "train with --temperature 1")
        if config.lora_alpha != TrainConfig.model_fields["lora_alpha"].default:
            raise ConfigError(f"--lora-alpha {config.lora_alpha}: the Tinker service sets the LoRA scale itself; "
                              "drop --lora-alpha (only --lora-rank reaches the service)")
        self.lora_rank = config.lora_rank or DEFAULT_LORA_RANK
        self.policy_version = 0
        self.steps_done = 0
        self.service: Any = None
        self.training: Any = None
        self.snapshot_path: str | None = None
        """The service state (weights + optimizer) after the last finished step: what a failed step restarts from."""
        self.dirty = False
        """True when the live client's weights may differ from `snapshot_path` (a failure it could not undo)."""
        self.reference: Any = None  # a sampling client of the base model, for KL's reference logprobs
        self.tokenizer: Any = None
        self.server: Any = None
        self.context_length: int | None = None
        self._failed = False

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            losses=frozenset(LOSSES), agg_modes=frozenset(AGG_MODES), kl_types=frozenset({"k1", "k3"}), lora=True,
            recompute_old_logprobs=False, devices=frozenset({"cpu", "cuda", "mps"}), async_train_step=True,
            async_rollouts=True,
            notes={"n_gpus": "the Tinker service chooses the GPUs it trains on", "nnodes": "the Tinker service "
                   "chooses the machines it trains on",
                   "images": "rllm's Tinker datums carry tokens only (no image chunks)",
                   "recompute_old_logprobs": "Tinker's sampler reports the logprobs the update uses as π_old; "
                                             "there is no separate recompute pass",
                   "device": "the update runs on the Tinker service; --device only matters locally",
                   "rollout_is": "π_prox needs a recompute pass Tinker does not make (see recompute_old_logprobs)"})

    # ------------------------------------------------------------------ setup
    def setup(self, config: TrainConfig) -> None:
        """Check the model against the service. The training client is created on first use, or from a
        checkpoint's state by `load` (a resume never opens a throwaway run first)."""
        from rllm_backends.tinker.sdk import service_client

        self.config = config
        self.service = service_client()
        self.context_length = check_base_model(self.service, config.model)

    def _ensure_client(self) -> None:
        from rllm_backends.tinker.retry import call_with_retries, service_error

        if self.service is None:
            raise TrainingError("the tinker backend is not set up: call setup(config) first")
        if self.training is not None:
            return
        c = self.config
        try:
            self.training = call_with_retries(
                lambda: self.service.create_lora_training_client(base_model=c.model, rank=self.lora_rank,
                                                                 seed=c.seed).result(),
                what="create_lora_training_client")
        except TrainingError as exc:
            raise ConfigError(f"the Tinker service refused a LoRA run of {c.model!r} at rank {self.lora_rank}: "
                              f"{service_error(exc)}") from None
        self.snapshot_path = self.save_state(f"step{self.steps_done}", ttl=SNAPSHOT_TTL_S)
        self._after_new_training_client()

    def _after_new_training_client(self) -> None:
        from rllm_backends.tinker.retry import call_with_retries
        from rllm_backends.tinker.server import start_tinker_sampling_server

        self.tokenizer = self.training.get_tokenizer()
        client = call_with_retries(lambda: self.training.save_weights_and_get_sampling_client().result(),
                                   what="save_weights_and_get_sampling_client")
        if self.plan.needs_ref_logprobs and self.reference is None:
            self.reference = call_with_retries(
                lambda: self.service.create_sampling_client(base_model=self.config.model).result(),
                what="create_sampling_client")
        if self.server is None:
            concurrency = int(self.options["max_concurrency"])
            self.server = start_tinker_sampling_server(client, model_name=self.config.model,
                                                       tokenizer=self.tokenizer, context_length=self.context_length,
                                                       max_concurrency=concurrency,
                                                       policy_version=self.policy_version)
        self.server.swap(client, self.policy_version)

    def save_state(self, label: str, ttl: int | None = None) -> str:
        """Save the live client's weights + optimizer on the service; its `tinker://` path."""
        from rllm_backends.tinker.retry import call_with_retries

        name = f"rllm-{label}-{uuid.uuid4().hex[:8]}"
        return call_with_retries(lambda: self.training.save_state(name, ttl_seconds=ttl).result(),
                                 what="save_state").path

    def restore(self, path: str) -> None:
        """Replace the training client by one created from the saved state `path` (weights and optimizer)."""
        from rllm_backends.tinker.retry import call_with_retries

        self.training = call_with_retries(
            lambda: self.service.create_training_client_from_state_with_optimizer(path).result(),
            what="create_training_client_from_state_with_optimizer")

    # ------------------------------------------------------------------ rollouts
    def policy_endpoint(self) -> PolicyEndpoint:
        self._ensure_client()
        return PolicyEndpoint(base_url=self.server.base_url, model=self.server.model_name,
                              policy_version=self.policy_version, tokenizer=self.tokenizer, inject_token_ids=True,
                              exact_turns=True)

    # ------------------------------------------------------------------ update
    def train_step(self, rows: Sequence[TrainRow]) -> TrainStepResult:
        """Submit the step's requests now (the service pipelines them); an awaitable of its metrics."""
        self._ensure_client()
        update = StepUpdate(self, list(rows))
        update.submit_now()  # forward_backward + optim_step + snapshot queued before train_step returns
        return self._apply(update)

    async def _apply(self, update: StepUpdate) -> dict[str, float]:
        """The update's outcome, applied here: the new snapshot and step count, or the failure's state (the live
        weights unknown when its rollback failed, so `save` restores the last snapshot first)."""
        self.dirty = True  # until the step settles: a crash now must not checkpoint half-updated weights
        try:
            outcome = await update.run()
        except StepFailed as exc:
            self._failed = True
            self.dirty = not exc.weights_known
            raise
        self.snapshot_path, self.dirty = outcome.snapshot_path, False
        self.steps_done += 1
        return outcome.metrics

    def adam_params(self) -> Any:
        """AdamW with rllm's settings; the learning rate of this step from --warmup-steps / --lr-schedule."""
        import tinker

        from rllm_backends.tinker.schedule import lr_at

        c = self.config
        lr = lr_at(self.steps_done, lr=c.lr, warmup_steps=c.warmup_steps, schedule=c.lr_schedule,
                   max_steps=c.max_steps)
        return tinker.types.AdamParams(learning_rate=lr, beta1=ADAM_BETAS[0], beta2=ADAM_BETAS[1], eps=ADAM_EPS,
                                       weight_decay=c.weight_decay, grad_clip_norm=c.max_grad_norm)

    def sync_weights(self) -> int:
        from rllm_backends.tinker.retry import call_with_retries

        self._ensure_client()
        client = call_with_retries(lambda: self.training.save_weights_and_get_sampling_client().result(),
                                   what="save_weights_and_get_sampling_client")
        self.policy_version += 1
        self.server.swap(client, self.policy_version)
        return self.policy_version

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Path) -> None:
        from rllm_backends.tinker.retry import call_with_retries

        self._ensure_client()
        if self.dirty:  # after a failure the live weights are unknown: checkpoint the last finished step's state
            if self.snapshot_path is None:
                raise TrainingError("the Tinker service state after the last finished step is unknown; nothing "
                                    "safe to checkpoint")
            self.restore(self.snapshot_path)
            self.dirty = False
        label = f"{Path(self.config.output).name}-step{self.steps_done}"
        state = self.save_state(label)  # no expiry: a checkpoint must outlive the per-step snapshots
        sampler = call_with_retries(lambda: self.training.save_weights_for_sampler(
            f"rllm-{label}-{uuid.uuid4().hex[:8]}").result(), what="save_weights_for_sampler")
        (Path(path) / STATE_FILE).write_text(json.dumps({
            "state_path": state, "sampler_path": sampler.path, "base_model": self.config.model,
            "lora_rank": self.lora_rank, "policy_version": self.policy_version, "steps_done": self.steps_done,
            "tinker_version": self.tinker_version}, indent=2), encoding="utf-8")

    def load(self, path: Path) -> None:
        state = read_checkpoint(Path(path))
        if state["base_model"] != self.config.model:
            raise ConfigError(f"checkpoint {path} trains {state['base_model']!r}, not --model {self.config.model!r}")
        if int(state["lora_rank"]) != self.lora_rank:
            raise ConfigError(f"checkpoint {path} holds LoRA rank {state['lora_rank']}, not --lora-rank "
                              f"{self.lora_rank}: resume with --lora-rank {state['lora_rank']}")
        if self.service is None:
            raise TrainingError("the tinker backend is not set up: call setup(config) first")
        self.restore(state["state_path"])
        self.snapshot_path, self.dirty = state["state_path"], False
        self.policy_version, self.steps_done = int(state["policy_version"]), int(state["steps_done"])
        self._after_new_training_client()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        service, self.service = self.service, None
        if service is not None and hasattr(service, "close"):  # ends the session on the service (SDK 0.38)
            with contextlib.suppress(Exception):
                service.close("errored" if self._failed else "success").result(30)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """What `TinkerBackend.save` wrote into checkpoint directory `path`; TrainingError when it is not there."""
    file = path / STATE_FILE
    if not file.is_file():
        raise TrainingError(f"checkpoint {path} has no {STATE_FILE}: it was not written by the tinker backend")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TrainingError(f"checkpoint {path}: {STATE_FILE} is unreadable ({exc})") from None
