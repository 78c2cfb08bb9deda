"""The training backend seam (v2): the Backend protocol, its records, and how a backend registers.

A backend owns the trainable weights and the inference engines that sample from them. The loop calls, per step:

    before_rollouts() → [rollouts against policy_endpoint()] → after_rollouts()
    → train_step(rows) (a dict, or a Future / awaitable of one) → sync_weights() -> policy_version

plus setup(config) · capabilities() · save(path) · load(path) · shutdown(). What v2 says that v1 could not:

- `policy_endpoint()` is a *set* of upstreams (`PolicyEndpoint.replicas`: verl runs several vLLM/SGLang
  servers); the loop's gateway routes sessions over them (sticky) and takes a new set after each sync.
- `before_rollouts` / `after_rollouts` are the lifecycle of a colocated engine (wake it and load weights;
  free its KV cache before the update): explicit, never hidden inside `train_step`.
- `train_step` may return before the update finishes (a `concurrent.futures.Future` or an awaitable), so
  remote and Ray backends pipeline; the loop awaits it with `resolve_metrics`.
- `capabilities()` says what the backend computes itself (losses, aggregation modes, KL, LoRA, recomputed
  π_old): `check_capabilities` refuses an unsupported combination before anything loads, naming the option,
  instead of a backend silently training another objective.
- Each `TrainRow` carries the behaviour logprobs (`sampling_logprobs`), optional recomputed `old_logprobs`
  and its sampling `temperature`, so decoupled PPO and off-policy training need no further change here.

Backends are registered through the `rllm_register_backends` hook as `BackendSpec(name, factory)`,
`factory(config) -> Backend`. Subclass `BackendBase` for the optional methods' defaults, and run
`rllm_testing.backend_contract` against yours (docs/training.md says how); `rllm_testing.recording_backend`
is the double beside this seam.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from rllm_core.errors import ConfigError, TrainingError
from rllm_core.plugins import PluginManager, get_plugin_manager
from rllm_train.algorithms.names import AGG_MODES, LOSSES

if TYPE_CHECKING:
    from rllm_rollout.gateway.config import UpstreamConfig
    from rllm_train.config import TrainConfig
    from rllm_train.packing import TrainRow

__all__ = [
    "Backend",
    "BackendBase",
    "BackendCapabilities",
    "BackendSpec",
    "ExportRequest",
    "ExportResult",
    "PolicyEndpoint",
    "TrainStepResult",
    "check_capabilities",
    "create_backend",
    "get_backends",
    "parse_backend_options",
    "resolve_metrics",
]

OptionsT = TypeVar("OptionsT", bound=BaseModel)

TrainStepResult = dict[str, float] | concurrent.futures.Future | Awaitable[dict[str, float]]
"""What `train_step` returns: the metrics, or a future / awaitable that yields them when the update is done."""


@dataclass(frozen=True)
class PolicyEndpoint:
    """Where rollouts send their LLM calls, and which policy version serves them."""

    base_url: str
    model: str
    policy_version: int = 0
    api_key: str | None = None
    tokenizer: object | None = None
    """Optional tokenizer, for retokenizing upstreams that return no token ids."""
    replicas: tuple[str, ...] = ()
    """Every server of this policy (base URLs ending in /v1). Empty: `base_url` alone."""
    inject_token_ids: bool | None = None
    """Ask the servers for token ids and logprobs (None: auto, on for loopback servers)."""
    exact_turns: bool = False
    """The servers take `rllm_continue` hints (rllm's policy server): multi-turn prompts stay token-exact."""
    role_models: dict[str, str] = field(default_factory=dict)
    """With a policy per role (--roles): role → the model name its calls are sent with ('*': other roles). The
    gateway rewrites each call's `model` by the calling agent's role, so the agent's own code never changes."""

    @property
    def upstream_urls(self) -> tuple[str, ...]:
        return self.replicas or (self.base_url,)

    def upstream_configs(self) -> list[UpstreamConfig]:
        """The gateway's upstream records for every replica."""
        from rllm_rollout.gateway.config import UpstreamConfig

        return [UpstreamConfig(url=u, api_key=self.api_key, inject_token_ids=self.inject_token_ids,
                               exact_turns=self.exact_turns, role_models=self.role_models)
                for u in self.upstream_urls]


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend can honour; the loop refuses any other config up front (`check_capabilities`)."""

    losses: frozenset[str] = frozenset(LOSSES)
    agg_modes: frozenset[str] = frozenset(AGG_MODES)
    kl_types: frozenset[str] = frozenset({"k1", "k3"})
    """KL-to-reference estimators it can add as a loss term (empty: --kl-coef must stay 0)."""
    lora: bool = True
    role_adapters: bool = False
    """It can train a LoRA adapter per role in one step and serve them all, picked per request (--roles)."""
    recompute_old_logprobs: bool = True
    async_rollouts: bool = False
    """Its policy endpoint keeps serving while it trains and takes new weights without draining (--max-staleness)."""
    rollout_is: bool = False
    """It weights the policy loss by π_prox/μ (--rollout-is token|sequence: off-policy correction)."""
    devices: frozenset[str] = frozenset({"cpu", "cuda"})
    """Values of --device it accepts (device type, before any ':N')."""
    multi_gpu: bool = False
    """It trains on a cluster of --n-gpus GPUs per node × --nnodes nodes; otherwise both must stay 1."""
    async_train_step: bool = False
    """True when train_step returns before the update is done (a future): the loop overlaps its own I/O."""
    colocated: bool = False
    """True when sampling and training share devices, so before/after_rollouts wake and free the engine."""
    images: bool = False
    """It trains rows whose prompts show images (a vision-language model: pixel inputs beside the tokens)."""
    notes: dict[str, str] = field(default_factory=dict)
    """Option name → why it is refused, said in the error (e.g. {"agg": "verl scales it by the batch size"})."""


def check_images(rows: Sequence[TrainRow], caps: BackendCapabilities, backend: str) -> None:
    """Refuse, by the backend's name, rows with images on a backend that would train their tokens without them."""
    with_images = sum(1 for r in rows if r.images)
    if with_images and not caps.images:
        why = caps.notes.get("images")
        raise TrainingError(f"backend {backend!r} cannot train on images ({with_images} rows of this step show "
                            f"some{': ' + why if why else ''}); train a vision-language model with --backend local")


def check_capabilities(config: TrainConfig, caps: BackendCapabilities, backend: str) -> None:
    """Raise one ConfigError listing every option `backend` cannot honour, by flag name."""
    problems: list[str] = []

    def refuse(option: str, value: object, allowed: object) -> None:
        why = caps.notes.get(option)
        problems.append(f"--{option.replace('_', '-')} {value} (supported: {allowed}{'; ' + why if why else ''})")

    if config.loss not in caps.losses:
        refuse("loss", config.loss, ", ".join(sorted(caps.losses)) or "none")
    if config.agg not in caps.agg_modes:
        refuse("agg", config.agg, ", ".join(sorted(caps.agg_modes)) or "none")
    if config.kl_coef > 0 and config.kl_type not in caps.kl_types:
        refuse("kl_type", config.kl_type, ", ".join(sorted(caps.kl_types)) or "no KL term: --kl-coef 0")
    if config.lora_rank > 0 and not caps.lora:
        refuse("lora_rank", config.lora_rank, "0, full fine-tuning")
    if config.roles and not caps.role_adapters:
        refuse("roles", ",".join(f"{r}={s}" for r, s in config.roles.items()),
               "none: it trains one policy that every role shares")
    if config.recompute_old_logprobs and not caps.recompute_old_logprobs:
        refuse("recompute_old_logprobs", "on", "off")
    if config.max_staleness > 0 and not caps.async_rollouts:
        refuse("max_staleness", config.max_staleness, "0: its sampler cannot serve while it trains")
    if config.rollout_is != "none" and not caps.rollout_is:
        refuse("rollout_is", config.rollout_is, "none")
    if config.device.split(":", 1)[0] not in caps.devices:
        refuse("device", config.device, ", ".join(sorted(caps.devices)))
    if not caps.multi_gpu:  # never silently train on one device when a cluster was asked for
        for option in ("n_gpus", "nnodes"):
            if getattr(config, option) > 1:
                refuse(option, getattr(config, option), "1: it trains on one device")
    if problems:
        raise ConfigError(f"the {backend!r} backend cannot train with {'; '.join(problems)}: change these options "
                          "or choose another --backend (see `rllm plugins`)")


async def resolve_metrics(result: TrainStepResult) -> dict[str, float]:
    """The metrics of a train_step, waiting (without blocking the event loop) when it returned a future."""
    if isinstance(result, concurrent.futures.Future):
        result = await asyncio.wrap_future(result)
    elif inspect.isawaitable(result):
        result = await result
    if not isinstance(result, dict):
        raise TrainingError(f"the backend's train_step gave {type(result).__name__}, not a dict of metrics")
    return result


@runtime_checkable
class Backend(Protocol):
    """What a training backend provides; see the module docstring."""

    name: str

    def capabilities(self) -> BackendCapabilities:
        """What this backend can train (checked against the config before setup)."""

    def setup(self, config: TrainConfig) -> None:
        """Load the model, build the optimizer, start the inference engines."""

    def policy_endpoint(self) -> PolicyEndpoint:
        """The endpoint (one or more replicas) rollouts should call now."""

    def before_rollouts(self) -> None:
        """Make the engines ready to sample (wake a colocated engine, restore its KV cache)."""

    def after_rollouts(self) -> None:
        """Rollouts are done: free what the update needs (a colocated engine's KV cache)."""

    def train_step(self, rows: Sequence[TrainRow]) -> TrainStepResult:
        """One optimizer step on `rows`; returns metrics (loss, grad_norm, ...) or a future of them.
        Raises (or the future raises) TrainingError, weights untouched, on a non-finite loss or a batch that
        does not fit."""

    def sync_weights(self) -> int:
        """Push the new weights to the engines; returns the new policy version."""

    def save(self, path: Path) -> None:
        """Write everything needed to resume (weights, optimizer, scheduler, version) into directory `path`."""

    def load(self, path: Path) -> None:
        """Restore what `save` wrote; afterwards the policy endpoint serves the restored weights."""

    def shutdown(self) -> None:
        """Stop servers, free memory. Safe to call twice."""


class BackendBase:
    """Defaults for the optional parts of the protocol: every loss option, no engine lifecycle."""

    name = "base"

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities()

    def before_rollouts(self) -> None:
        return None

    def after_rollouts(self) -> None:
        return None


_METHODS = ("capabilities", "setup", "policy_endpoint", "before_rollouts", "after_rollouts", "train_step",
            "sync_weights", "save", "load", "shutdown")


@dataclass(frozen=True)
class ExportRequest:
    """What the user asked `rllm export` for (all but `out` optional; a backend refuses what it cannot do)."""

    out: Path
    fmt: str = "hf"
    merge_lora: bool = False
    role: str | None = None
    dtype: str | None = None
    force: bool = False

    @property
    def as_is(self) -> bool:
        """Nothing asked beyond the checkpoint's own weights in its own layout."""
        return self.fmt == "hf" and not (self.merge_lora or self.role or self.dtype)


@dataclass
class ExportResult:
    checkpoint: Path
    out: Path
    files: list[Path]
    what: str


@dataclass(frozen=True)
class BackendSpec:
    """A training backend: `factory(config)` returns an object implementing the Backend protocol.

    `options`: the pydantic model of this backend's own settings, read from `backend_options` (YAML/TOML), so
    each backend gets a typed sub-config instead of fields every backend receives; checked when the backend is
    created, before anything loads (a misspelt or mistyped option is refused by name). None: not checked here
    (verl's options are verl's own config keys, which verl's config composition checks).

    `owns_checkpoint(path)` and `export(path, request)`: optional, for `rllm export` of the checkpoints this
    backend writes (rllm_train.export hands each checkpoint to the one backend that owns it)."""

    name: str
    factory: Callable[..., Any]
    description: str = ""
    requires: str | None = None
    owns_checkpoint: Callable[[Path], bool] | None = None
    export: Callable[[Path, ExportRequest], ExportResult] | None = None
    options: type[BaseModel] | None = None


def parse_backend_options(model: type[OptionsT], options: Mapping[str, Any], backend: str) -> OptionsT:
    """`backend_options` as the backend's typed sub-config, or a one-line ConfigError naming the option."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        known = ", ".join(model.model_fields) or "none"
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"backend_options.{where} is not an option of the {backend!r} backend (its options: "
                              f"{known})") from None
        message = str(err["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"backend_options.{where} {message}" if message.startswith("must")
                          else f"backend_options.{where}: {message} (the {backend!r} backend's options: {known})"
                          ) from None


def get_backends(pm: PluginManager | None = None) -> dict[str, BackendSpec]:
    """Backends by name (`rllm_register_backends`); on a clash the first in call order wins (a tryfirst or
    later-registered plugin overrides a built-in)."""
    return (pm or get_plugin_manager()).collect_named("rllm_register_backends")


def create_backend(name: str, config: TrainConfig) -> Backend:
    """Build the backend registered under `name` (through the `rllm_register_backends` hook)."""
    specs = get_backends()
    if name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(f"unknown backend {name!r}; installed backends: {known} (see `rllm plugins`)")
    if specs[name].options is not None:  # a typo in the backend's own options fails before anything loads
        parse_backend_options(specs[name].options, config.backend_options, name)
    backend = specs[name].factory(config)
    missing = [m for m in _METHODS if not callable(getattr(backend, m, None))]
    if missing or not isinstance(backend, Backend):
        raise ConfigError(f"backend {name!r} factory returned {type(backend).__name__}, which lacks the Backend "
                          f"method(s) {', '.join(missing) or 'name'}: implement them, or subclass "
                          "rllm_train.backend.BackendBase for the optional ones' defaults")
    return backend

