"""An in-process double of the Tinker SDK 0.38 clients, so the train loop and the sampling adapter run offline.

`ServiceDouble`, `TrainingClientDouble` and `SamplingClientDouble` have the public methods of `tinker.ServiceClient`,
`tinker.TrainingClient` and `tinker.SamplingClient` that rllm uses, with the SDK's exact parameter names, kinds and
defaults (a test compares `inspect.signature` with the installed SDK), and they return the SDK's own types and future
shapes: `forward_backward(...)` → an `APIFuture` (`.result()`, or `await` it); the deprecated
`forward_backward_async(...)` is a coroutine returning that future (``await (await tc.forward_backward_async(...))``);
client-creating methods return an `APIFuture` of the client (also usable, deprecated, as the client, like the SDK's
`Backcompat*ClientFuture`). Server-side failures surface from the future, as in the SDK; argument errors the SDK
checks locally are raised at the call.

The service behind them is a tiny torch model (`double_model.py`: it trains all weights, not LoRA: the double
checks the protocol, not LoRA numerics). Checkpoints live under `root` as ``tinker://<run>/weights/<name>`` and
``tinker://<run>/sampler_weights/<name>``, so a new ServiceDouble (another process too) reads them back.
`faults` makes the next calls of a method fail with a transient error the SDK's retry logic would retry; `log`
records every response the service returned.

Wire it in with ``RLLM_TINKER_SERVICE=rllm_backends.tinker.double:service_double_from_env``.
"""

from __future__ import annotations

import os
import random
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import tinker
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture
from typing_extensions import deprecated

from rllm_backends.tinker.double_model import (
    ASYNC_DEPRECATION,
    FAULT_KINDS,
    Faults,
    LogEntry,
    RestClientDouble,
    SamplingClientDouble,
    TinyPolicy,
    base_policy,
    client_future,
    http_error,
    run_op,
)
from rllm_backends.tinker.double_training import TrainingClientDouble

__all__ = [
    "DOUBLE_DIR_ENV",
    "DOUBLE_MODELS_ENV",
    "FAULT_KINDS",
    "Faults",
    "LogEntry",
    "RestClientDouble",
    "SamplingClientDouble",
    "ServiceDouble",
    "TrainingClientDouble",
    "service_double_from_env",
]

DOUBLE_DIR_ENV = "RLLM_TINKER_DOUBLE_DIR"
DOUBLE_MODELS_ENV = "RLLM_TINKER_DOUBLE_MODELS"

C = TypeVar("C")
_ASYNC_DEPRECATION = ASYNC_DEPRECATION


class ServiceDouble:
    """`tinker.ServiceClient` over a local tiny model (see the module docstring).

    `base_models`: the names it accepts (any name; each is served by `model_name_map[name]`, default
    ``tiny-random``). `max_lora_rank`: the largest rank accepted (ranks must also be powers of two).
    `faults`: ``{method: n}`` or ``{method: (n, kind)}``, kind in FAULT_KINDS; more with `self.faults.add(...)`.
    """

    def __init__(self, root: Path | str, base_models: tuple[str, ...] | list[str] = ("tiny-random",),
                 max_lora_rank: int = 128, model_name_map: Mapping[str, str] | None = None,
                 faults: Mapping[str, int | tuple[int, str]] | None = None) -> None:
        if not base_models:
            raise ValueError("base_models is empty; give at least one model name the double should serve")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.base_models = tuple(base_models)
        self.max_lora_rank = int(max_lora_rank)
        self.model_name_map = {m: "tiny-random" for m in self.base_models} | dict(model_name_map or {})
        self.faults = Faults(faults)
        self.log: list[LogEntry] = []
        self.session_id = f"double-{uuid.uuid4().hex[:12]}"
        self.rng = random.Random()
        self._sequence_counter = 0

    # -- internals shared with the clients ------------------------------------------------------------------------
    def _next_sequence_id(self) -> str:
        self._sequence_counter += 1
        return f"{self.session_id}:seq:{self._sequence_counter}"

    def _check_model(self, base_model: str) -> None:
        if base_model not in self.base_models:
            raise http_error(tinker.BadRequestError, 400, f"base model {base_model!r} is not supported; supported "
                             f"models: {', '.join(self.base_models)}")

    def _policy(self, base_model: str) -> TinyPolicy:
        return base_policy(self.model_name_map.get(base_model, "tiny-random"))

    def _ckpt_dir(self, path: str, *, kinds: tuple[str, ...] = ("weights", "sampler_weights")) -> Path:
        """The folder of checkpoint `path` (tinker://run/<kind>/name); NotFoundError naming what exists."""
        try:
            parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(path)
        except ValueError:
            raise http_error(tinker.BadRequestError, 400, f"invalid checkpoint path {path!r}: expected "
                             "tinker://<run-id>/weights/<name> or tinker://<run-id>/sampler_weights/<name>") from None
        kind = parsed.checkpoint_id.split("/", 1)[0]
        if kind not in kinds:
            raise http_error(tinker.BadRequestError, 400, f"{path!r} is a {kind} checkpoint; this call needs "
                             f"one of: {', '.join(kinds)}")
        folder = self.root / parsed.training_run_id / parsed.checkpoint_id
        if not (folder / "model.pt").exists():
            raise http_error(tinker.NotFoundError, 404, f"checkpoint {path!r} not found under {self.root}")
        return folder

    def _training_from_state(self, path: str, base_model: str | None, with_optimizer: bool) -> TrainingClientDouble:
        folder = self._ckpt_dir(path, kinds=("weights",))
        meta = TrainingClientDouble.read_meta(folder)
        model = base_model or meta["base_model"]
        self._check_model(model)
        client = TrainingClientDouble(self, model, int(meta["lora_rank"]), self._policy(model))
        client.restore(folder, with_optimizer=with_optimizer)
        return client

    def _sampling(self, model_path: str | None, base_model: str | None) -> SamplingClientDouble:
        if model_path is not None:
            folder = self._ckpt_dir(model_path)
            meta = TrainingClientDouble.read_meta(folder)
            policy = self._policy(meta["base_model"])
            policy.load_state_dict(TrainingClientDouble.read_weights(folder))
            return SamplingClientDouble(self, meta["base_model"], lambda p=policy.frozen_copy(): p, model_path)
        assert base_model is not None
        self._check_model(base_model)
        frozen = self._policy(base_model).frozen_copy()
        return SamplingClientDouble(self, base_model, lambda: frozen, None)

    def _create_lora(self, base_model: str, rank: int) -> TrainingClientDouble:
        self._check_model(base_model)
        if rank < 1 or rank & (rank - 1) or rank > self.max_lora_rank:
            raise http_error(tinker.BadRequestError, 400, f"LoRA rank {rank} is not supported: give a power of two "
                             f"from 1 to {self.max_lora_rank}")
        return TrainingClientDouble(self, base_model, rank, self._policy(base_model))

    # -- the ServiceClient surface --------------------------------------------------------------------------------
    @deprecated("DEPRECATED in the SDK: use tinker.RestClient().get_server_capabilities()", category=FutureWarning)
    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The supported models (all trainable and sampleable; context length of the tiny model)."""
        return run_op(self, "get_server_capabilities", {}, self._capabilities).result()

    @deprecated("DEPRECATED in the SDK: use await tinker.RestClient().get_server_capabilities()",
                category=FutureWarning)
    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return await run_op(self, "get_server_capabilities", {}, self._capabilities)

    def close(self, status: Literal["success", "errored", "interrupted"], detail: str | None = None) -> Any:
        """Ends the session: later calls are refused, as the service would."""
        self.closed = status
        return run_op(self, "close", {"status": status, "detail": detail}, lambda: None)

    def create_rest_client(self) -> RestClientDouble:
        """The SDK's non-deprecated way to ask for capabilities: `create_rest_client().get_server_capabilities()`."""
        return RestClientDouble(self)

    def _capabilities(self) -> types.GetServerCapabilitiesResponse:
        return types.GetServerCapabilitiesResponse(supported_models=[
            types.SupportedModel(model_name=m, max_context_length=self._policy_context(m), trainable=True,
                                 sampleable=True) for m in self.base_models])

    def _policy_context(self, base_model: str) -> int:
        from rllm_backends.tinker.double_model import _load

        return int(_load(self.model_name_map.get(base_model, "tiny-random")).context_length)

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict[str, str] | None = None,
                                    optimizer: types.OptimizerConfig | None = None) -> APIFuture[TrainingClientDouble]:
        """A training client on `base_model`; a future of it (BadRequestError in it for a bad model or rank)."""
        assert any([train_mlp, train_attn, train_unembed]), (
            "At least one of train_mlp, train_attn, or train_unembed must be True")
        if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
            raise ValueError(f"the Tinker double implements only the adamw optimizer, not {optimizer.type!r}")
        return client_future(run_op(self, "create_lora_training_client", {"base_model": base_model, "rank": rank},
                                    lambda: self._create_lora(base_model, rank)))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def create_lora_training_client_async(
            self, base_model: str, rank: int = 32, seed: int | None = None, train_mlp: bool = True,
            train_attn: bool = True, train_unembed: bool = True, user_metadata: dict[str, str] | None = None,
            optimizer: types.OptimizerConfig | None = None) -> TrainingClientDouble:
        return await self.create_lora_training_client(base_model, rank, seed, train_mlp, train_attn, train_unembed,
                                                      user_metadata, optimizer)

    def create_training_client_from_state(self, path: str, base_model: str | None = None,
                                          user_metadata: dict[str, str] | None = None,
                                          weights_access_token: str | None = None,
                                          optimizer: types.OptimizerConfig | None = None,
                                          ) -> APIFuture[TrainingClientDouble]:
        """A training client with the weights of `path` (a save_state checkpoint) and a fresh optimizer."""
        return client_future(run_op(self, "create_training_client_from_state", {"path": path},
                                    lambda: self._training_from_state(path, base_model, with_optimizer=False)))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def create_training_client_from_state_async(
            self, path: str, base_model: str | None = None, user_metadata: dict[str, str] | None = None,
            weights_access_token: str | None = None,
            optimizer: types.OptimizerConfig | None = None) -> TrainingClientDouble:
        return await self.create_training_client_from_state(path, base_model, user_metadata, weights_access_token,
                                                            optimizer)

    def create_training_client_from_state_with_optimizer(self, path: str, base_model: str | None = None,
                                                         user_metadata: dict[str, str] | None = None,
                                                         weights_access_token: str | None = None,
                                                         ) -> APIFuture[TrainingClientDouble]:
        """A training client with the weights and the AdamW state of `path`."""
        return client_future(run_op(self, "create_training_client_from_state_with_optimizer", {"path": path},
                                    lambda: self._training_from_state(path, base_model, with_optimizer=True)))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def create_training_client_from_state_with_optimizer_async(
            self, path: str, base_model: str | None = None, user_metadata: dict[str, str] | None = None,
            weights_access_token: str | None = None) -> TrainingClientDouble:
        return await self.create_training_client_from_state_with_optimizer(path, base_model, user_metadata,
                                                                           weights_access_token)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config: Any | None = None,
                               record_stability_info: bool = False) -> APIFuture[SamplingClientDouble]:
        """A sampling client on saved weights (`model_path`) or on the untrained `base_model`."""
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")
        return client_future(run_op(self, "create_sampling_client",
                                    {"model_path": model_path, "base_model": base_model},
                                    lambda: self._sampling(model_path, base_model)))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def create_sampling_client_async(self, model_path: str | None = None, base_model: str | None = None,
                                           retry_config: Any | None = None,
                                           record_stability_info: bool = False) -> SamplingClientDouble:
        return await self.create_sampling_client(model_path, base_model, retry_config, record_stability_info)


def service_double_from_env() -> ServiceDouble:
    """The RLLM_TINKER_SERVICE factory: checkpoints under $RLLM_TINKER_DOUBLE_DIR (default: a fresh temp dir, so
    set it to share checkpoints across processes), models from $RLLM_TINKER_DOUBLE_MODELS (comma-separated,
    default ``tiny-random``)."""
    root = os.environ.get(DOUBLE_DIR_ENV, "").strip() or tempfile.mkdtemp(prefix="rllm-tinker-double-")
    models = [m.strip() for m in os.environ.get(DOUBLE_MODELS_ENV, "").split(",") if m.strip()]
    return ServiceDouble(Path(root), base_models=tuple(models) or ("tiny-random",))

