"""The `tinker` backend: rllm's rollouts and rewards here, the update and the sampling on the Tinker service.

Per step, through the v2 seam:

- rollouts call a local OpenAI-compatible server (`server.start_tinker_sampling_server`) whose engine answers
  with the service's current `SamplingClient`: token ids and logprobs come straight from the samples, so the
  gateway records `token_source="server"` Steps, exactly as against vLLM;
- `train_step(rows)` converts rows to `tinker.types.Datum`s (`datum.rows_to_datums`), submits
  `forward_backward` (a built-in loss, or `forward_backward_custom` with rllm's own loss where the built-ins
  cannot express it: `losses.plan_loss`) and `optim_step` back to back, so the service pipelines them, and
  returns a task the loop awaits while it writes the step's episodes;
- `sync_weights()` saves the weights for sampling and swaps the server's client (requests already running
  finish on the client they started with);
- `save`/`load` keep the service's own state path (weights and optimizer) in rllm's checkpoint directory, so
  `--resume` works as for the local backend; each checkpoint also names its sampler weights, which
  `rllm eval --backend tinker --model RUN_DIR` samples from.

Transient service failures are retried with backoff (tenacity); when the retries are spent the step raises
TrainingError and the loop stops with a resumable checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_core.algorithms.names import AGG_MODES, LOSSES
from rllm_core.backend import BackendBase, BackendCapabilities, PolicyEndpoint, TrainStepResult
from rllm_core.errors import ConfigError, TrainingError
from rllm_core.training.config import TrainConfig
from rllm_core.training.packing import TrainRow

__all__ = ["DEFAULT_LORA_RANK", "STATE_FILE", "TinkerBackend", "check_base_model"]

log = logging.getLogger("rllm.tinker")

STATE_FILE = "tinker_backend.json"
DEFAULT_LORA_RANK = 32
"""Tinker trains LoRA adapters only; --lora-rank 0 (rllm's 'full fine-tuning' default) means this rank."""


def check_base_model(service: Any, model: str) -> int | None:
    """The model's context length; ConfigError listing the service's trainable models when it is not one."""
    from rllm_backends.tinker.retry import call_with_retries
    from rllm_backends.tinker.sdk import rest_client

    caps = call_with_retries(lambda: rest_client(service).get_server_capabilities().result(),
                             what="get_server_capabilities")
    models = {m.model_name: m for m in caps.supported_models if m.model_name}
    found = models.get(model)
    if found is None or found.trainable is False:
        trainable = sorted(n for n, m in models.items() if m.trainable is not False)
        raise ConfigError(f"--model {model!r} is not a base model the Tinker service trains; it offers: "
                          f"{', '.join(trainable) or 'none'}")
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
        self.options: dict[str, Any] = dict(config.backend_options.get("tinker", config.backend_options) or {})
        self.plan = plan_loss(config, self.options)  # refuses a loss option Tinker cannot express, by name
        if config.temperature != 1.0:
            raise ConfigError(f"--temperature {config.temperature}: the Tinker service scores tokens at temperature "
                              "1, so rows sampled at another temperature would train with wrong importance ratios; "
                              "train with --temperature 1")
        self.lora_rank = config.lora_rank or DEFAULT_LORA_RANK
        self.policy_version = 0
        self.steps_done = 0
        self.service: Any = None
        self.training: Any = None
        self.reference: Any = None  # a sampling client of the base model, for KL's reference logprobs
        self.tokenizer: Any = None
        self.server: Any = None
        self.context_length: int | None = None

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            losses=frozenset(LOSSES), agg_modes=frozenset(AGG_MODES), kl_types=frozenset({"k1", "k3"}), lora=True,
            recompute_old_logprobs=False, devices=frozenset({"cpu", "cuda", "mps"}), async_train_step=True,
            notes={"recompute_old_logprobs": "Tinker's sampler reports the logprobs the update uses as π_old; "
                                             "there is no separate recompute pass",
                   "device": "the update runs on the Tinker service; --device only matters locally"})

    # ------------------------------------------------------------------ setup
    def setup(self, config: TrainConfig) -> None:
        from rllm_backends.tinker.retry import call_with_retries, service_error
        from rllm_backends.tinker.sdk import service_client

        self.config = config
        self.service = service_client()
        self.context_length = check_base_model(self.service, config.model)
        try:
            self.training = call_with_retries(
                lambda: self.service.create_lora_training_client(base_model=config.model, rank=self.lora_rank,
                                                                 seed=config.seed).result(),
                what="create_lora_training_client")
        except TrainingError as exc:
            raise ConfigError(f"the Tinker service refused a LoRA run of {config.model!r} at rank {self.lora_rank}: "
                              f"{service_error(exc)}") from None
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
            concurrency = int(self.options.get("max_concurrency", 64))
            self.server = start_tinker_sampling_server(client, model_name=self.config.model,
                                                       tokenizer=self.tokenizer, context_length=self.context_length,
                                                       max_concurrency=concurrency)
        self.server.swap(client, self.policy_version)

    def _require(self) -> None:
        if self.training is None or self.server is None:
            raise TrainingError("the tinker backend is not set up: call setup(config) first")

    # ------------------------------------------------------------------ rollouts
    def policy_endpoint(self) -> PolicyEndpoint:
        self._require()
        return PolicyEndpoint(base_url=self.server.base_url, model=self.server.model_name,
                              policy_version=self.policy_version, tokenizer=self.tokenizer, inject_token_ids=True,
                              exact_turns=True)

    # ------------------------------------------------------------------ update
    def train_step(self, rows: Sequence[TrainRow]) -> TrainStepResult:
        """Submit forward_backward + optim_step at once (the service pipelines them); a task of the metrics."""
        self._require()
        rows = list(rows)
        coro = self._update(rows)
        try:
            return asyncio.get_running_loop().create_task(coro)  # runs while the loop writes the episodes
        except RuntimeError:  # called from sync code (a notebook, the contract suite): an awaitable still
            return coro

    async def _update(self, rows: list[TrainRow]) -> dict[str, float]:
        from rllm_backends.tinker.update import run_update

        metrics = await run_update(self, rows)
        self.steps_done += 1
        return metrics

    def adam_params(self) -> Any:
        import tinker

        c = self.config
        return tinker.types.AdamParams(learning_rate=c.lr, weight_decay=c.weight_decay,
                                       grad_clip_norm=c.max_grad_norm)

    def sync_weights(self) -> int:
        from rllm_backends.tinker.retry import call_with_retries

        self._require()
        client = call_with_retries(lambda: self.training.save_weights_and_get_sampling_client().result(),
                                   what="save_weights_and_get_sampling_client")
        self.policy_version += 1
        self.server.swap(client, self.policy_version)
        return self.policy_version

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Path) -> None:
        from rllm_backends.tinker.retry import call_with_retries

        self._require()
        name = f"rllm-{Path(self.config.output).name}-v{self.policy_version}-s{self.steps_done}"
        state = call_with_retries(lambda: self.training.save_state(name).result(), what="save_state")
        sampler = call_with_retries(lambda: self.training.save_weights_for_sampler(name).result(),
                                    what="save_weights_for_sampler")
        (Path(path) / STATE_FILE).write_text(json.dumps({
            "state_path": state.path, "sampler_path": sampler.path, "base_model": self.config.model,
            "lora_rank": self.lora_rank, "policy_version": self.policy_version, "steps_done": self.steps_done,
            "tinker_version": self.tinker_version}, indent=2), encoding="utf-8")

    def load(self, path: Path) -> None:
        from rllm_backends.tinker.retry import call_with_retries

        state = read_checkpoint(Path(path))
        if state["base_model"] != self.config.model:
            raise ConfigError(f"checkpoint {path} trains {state['base_model']!r}, not --model {self.config.model!r}")
        self.training = call_with_retries(
            lambda: self.service.create_training_client_from_state_with_optimizer(state["state_path"]).result(),
            what="create_training_client_from_state_with_optimizer")
        self.policy_version, self.steps_done = int(state["policy_version"]), int(state["steps_done"])
        self._after_new_training_client()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def read_checkpoint(path: Path) -> dict[str, Any]:
    """What `TinkerBackend.save` wrote into checkpoint directory `path`; TrainingError when it is not there."""
    file = path / STATE_FILE
    if not file.is_file():
        raise TrainingError(f"checkpoint {path} has no {STATE_FILE}: it was not written by the tinker backend")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TrainingError(f"checkpoint {path}: {STATE_FILE} is unreadable ({exc})") from None
