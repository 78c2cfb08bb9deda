"""The `local` backend: the torch trainer plus an in-process policy server, on CPU or one GPU.

The trainer and the server hold separate copies of the model (fp32 master for training; the server's copy
is what rollouts sample from). After each step `sync_weights` pushes the trainer's (LoRA-merged) weights into
the running server (`update_weights`, no restart), which bumps the policy version every response carries.

With a policy per role (`--roles`) the server gets a copy of the trainer's PeftModel itself (every adapter,
unmerged) and samples each request with the adapter its `model` names (`shared` for any other name); the
endpoint's `role_models` makes the gateway send each role's calls under its adapter's name, and a sync pushes
only the LoRA tensors.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_backends.local_torch.options import LocalOptions, thread_budgets
from rllm_backends.local_torch.remote_server import connect_remote_server, push_weights, reconcile_remote_server
from rllm_core.errors import TrainingError
from rllm_serve.heap import release_free_memory
from rllm_serve.weights_route import RemotePolicyServer
from rllm_train.backend import BackendBase, BackendCapabilities, PolicyEndpoint, parse_backend_options
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow
from rllm_train.roles import SHARED_ADAPTER, role_models

__all__ = ["LocalTorchBackend"]

log = logging.getLogger("rllm.local")


class LocalTorchBackend(BackendBase):
    """Backend protocol over `TorchTrainer` + `start_policy_server`. `loaded` injects an already loaded model
    (tests, benchmarks); otherwise `config.model` is loaded with the serving package's `load_model`."""

    name = "local"

    def __init__(self, config: TrainConfig | None = None, *, loaded: Any = None, max_batch_size: int = 64,
                 server_threads: int | None = None) -> None:
        self.config = config
        self._loaded = loaded
        self._max_batch_size = max_batch_size
        self._server_threads = server_threads
        self.trainer: Any = None
        self.processor: Any = None
        self.server: Any = None
        self.policy_version = 0
        self.trainer_threads: int | None = None
        self.server_threads_while_training: int | None = None
        """With --max-staleness: the server's threads while an update runs (the trainer has `trainer_threads`)."""

    def capabilities(self) -> BackendCapabilities:
        """Every loss option (the loss is ours, computed here); the server holds its own copy of the weights, so
        nothing needs waking or freeing around rollouts; train_step is synchronous; one LoRA adapter per role
        (--roles), all served at once."""
        return BackendCapabilities(role_adapters=True, rollout_is=True, async_rollouts=True, images=True)

    def setup(self, config: TrainConfig) -> None:
        import torch

        from rllm_backends.local_torch.trainer import TorchTrainer, check_device
        from rllm_serve import load_model, start_policy_server

        check_device(config.device)  # before loading anything: a bad --device is one line, not a traceback
        self.config = config
        options = parse_backend_options(LocalOptions, config.backend_options, "local")
        server_threads = (None if options.policy_server
                          else self._plan_threads(options, config.max_staleness, torch.get_num_threads()))
        torch.manual_seed(config.seed)
        _quiet_transformers()  # its "Loading weights" bar would cut into the training display
        loaded = self._loaded or load_model(config.model, dtype=torch.float32, device=config.device)
        pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
        self.tokenizer = loaded.tokenizer
        self.processor = loaded.processor  # a VLM's: saved with each checkpoint (it holds the tokenizer)
        vision = {"processor": loaded.processor, "train_vision": options.train_vision}
        if options.policy_server:  # rollouts on another host's server (remote_server.py): it gets our weights
            self.trainer = TorchTrainer(loaded.model, config, pad_token_id=int(pad), **vision)
            self.server = connect_remote_server(options.policy_server, config)
            self.policy_version = self._push(self.trainer.serving_state_dict(), version=0)
            return
        serve_copy = copy.copy(loaded)
        if config.roles:  # the server serves the trainer's own PeftModel: built first, then copied
            self.trainer = TorchTrainer(loaded.model, config, pad_token_id=int(pad), **vision)
            serve_copy.model = copy.deepcopy(self.trainer.model).eval().requires_grad_(False)
        else:
            serve_copy.model = copy.deepcopy(loaded.model).eval().to(_server_dtype(options, config.device))
            self.trainer = TorchTrainer(loaded.model, config, pad_token_id=int(pad), **vision)
        self.server = start_policy_server(serve_copy, max_batch_size=self._max_batch_size,
                                          threads=server_threads,
                                          default_adapter=SHARED_ADAPTER if config.roles else None,
                                          own_model=True)  # its own deep copy
        self.policy_version = int(self.server.policy_version)

    def _plan_threads(self, options: LocalOptions, max_staleness: int, cores: int) -> int | None:
        """The server's threads at start, and (with --max-staleness) the split that holds while an update runs:
        the trainer's threads and the server's then (`thread_budgets`); outside updates the server has every
        core. A server_threads given in backend_options (or to the constructor) is kept throughout."""
        if options.server_threads is None and self._server_threads:  # a caller's choice (tests, benchmarks)
            options = options.model_copy(update={"server_threads": self._server_threads})
        server, self.trainer_threads = thread_budgets(options, max_staleness > 0, cores)
        if not max_staleness:
            return server
        self.server_threads_while_training = server
        log.info("--max-staleness %d: while an update runs, the policy server samples on %d thread(s) and the "
                 "trainer updates on %d (backend_options server_threads / trainer_threads)",
                 max_staleness, server, self.trainer_threads)
        return options.server_threads or cores

    def _require(self) -> None:
        if self.trainer is None or self.server is None:
            raise TrainingError("the local backend is not set up: call setup(config) first")

    def policy_endpoint(self) -> PolicyEndpoint:
        self._require()
        return PolicyEndpoint(base_url=self.server.base_url, model=self.server.model_name,
                              policy_version=self.policy_version, tokenizer=self.tokenizer, exact_turns=True,
                              inject_token_ids=True,  # our own server, on this host or another
                              role_models=role_models(self.config.roles) if self.config else {})

    def before_rollouts(self) -> None:
        """A policy server on another host that restarted serves its base weights again: push ours back first."""
        if isinstance(self.server, RemotePolicyServer):
            reconcile_remote_server(self.server, self.trainer, self.policy_version)

    def train_step(self, rows: Sequence[TrainRow]) -> dict[str, float]:
        self._require()
        # the server's packed copy of the weights is not needed while the trainer updates (rollouts are done;
        # sync_weights brings the new weights): dropping it takes a model's worth off the update's peak (the
        # engine declines for a peft server, --roles, whose updates carry only the adapters)
        # with --max-staleness the server samples the next steps meanwhile: it keeps its weights
        asynchronous = bool(self.config and self.config.max_staleness)
        remote = isinstance(self.server, RemotePolicyServer)
        released = False if asynchronous or remote else self.server.engine.release_weights()
        release_free_memory()  # what the rollouts freed: the update's peak then starts from what is held
        if self.trainer_threads:  # this thread's OpenMP team (the loop calls it from a worker thread when async)
            import torch

            torch.set_num_threads(self.trainer_threads)
        if self.server_threads_while_training:  # the cores the update takes, given back when it is done
            self.server.engine.set_threads(self.server_threads_while_training)
        try:
            metrics = self.trainer.train_step(rows)
        except BaseException:
            if released:  # the update failed and left the weights as they were: serve them again, same version
                self._push(self.trainer.serving_state_dict(), version=self.policy_version)
            raise
        finally:
            if self.server_threads_while_training:
                self.server.engine.set_threads(None)
        release_free_memory()  # the update's transient gigabytes: RSS stays flat from step to step
        if self.server_threads_while_training:  # the split, logged every step
            metrics.update({"async/server_threads": float(self.server_threads_while_training),
                            "async/trainer_threads": float(self.trainer_threads or 0)})
        versions = [r.policy_version for r in rows if r.policy_version is not None]
        if versions:
            metrics["train/policy_staleness_max"] = float(self.policy_version - min(versions))
        return metrics

    def sync_weights(self) -> int:
        self._require()
        self.policy_version = self._push(self.trainer.serving_state_dict())
        release_free_memory()
        return self.policy_version

    def save(self, path: Path) -> None:
        """A model directory any tool loads (checkpoint_io.py), with the resume state beside it."""
        self._require()
        self.trainer.save(path, tokenizer=self.processor or self.tokenizer,
                          base_model=self.config.model if self.config else None,
                          policy_version=self.policy_version)

    def load(self, path: Path) -> None:
        """Restore trainer state and push the restored weights into the server (it serves them at once)."""
        self._require()
        self.trainer.load(path)
        state_file = Path(path) / "local_backend.json"
        saved = json.loads(state_file.read_text()).get("policy_version") if state_file.is_file() else None
        self.policy_version = self._push(self.trainer.serving_state_dict(), version=saved)

    def _push(self, state_dict: Any, version: int | None = None) -> int:
        """New weights into the server: in this process, or over HTTP to another host's (waiting out a restart)."""
        if isinstance(self.server, RemotePolicyServer):
            return push_weights(self.server, state_dict, version=version)
        return int(self.server.update_weights(state_dict, version=version))

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _server_dtype(options: LocalOptions, device: str) -> Any:
    """The served copy's dtype (`server_dtype`; a per-role server keeps the trainer's, its adapters train)."""
    import torch

    from rllm_serve.models import default_dtype

    if options.server_dtype == "auto":
        dtype, why = default_dtype(device)
        log.info("policy server in %s: %s (backend_options server_dtype)", dtype, why)
        return dtype
    return getattr(torch, options.server_dtype)


def _quiet_transformers() -> None:
    """Turn off transformers' own progress bars (weight loading): `rllm train` draws one live display, and a
    second bar from a library, printed once per load, garbles it and the logs of `--no-progress` runs."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency of the local backend
        return
    hf_logging.disable_progress_bar()
