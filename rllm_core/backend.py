"""The training backend interface, and a recording test double beside it.

A backend owns the trainable weights and the policy endpoint that samples from them:

    setup(config) · policy_endpoint() -> PolicyEndpoint · train_step(rows) -> metrics
    sync_weights() -> policy_version · save(path) · load(path) · shutdown()

The loop never looks inside: local torch computes the loss in-process; verl would turn rows into a DataProto,
tinker into `Datum`s. Backends are registered through the `rllm_register_backends` hook as
`rllm_core.plugins.BackendSpec(name, factory)`, `factory(config) -> Backend`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rllm_core.errors import ConfigError, TrainingError

if TYPE_CHECKING:
    from rllm_core.training.config import TrainConfig
    from rllm_core.training.packing import TrainRow

__all__ = ["Backend", "PolicyEndpoint", "RecordingBackend", "create_backend"]


@dataclass(frozen=True)
class PolicyEndpoint:
    """Where rollouts send their LLM calls, and which policy version serves them."""

    base_url: str
    model: str
    policy_version: int = 0
    api_key: str | None = None
    tokenizer: object | None = None
    """Optional tokenizer, for retokenizing upstreams that return no token ids."""


@runtime_checkable
class Backend(Protocol):
    """What a training backend provides; see the module docstring."""

    name: str

    def setup(self, config: TrainConfig) -> None:
        """Load the model, build the optimizer, start the policy endpoint."""

    def policy_endpoint(self) -> PolicyEndpoint:
        """The endpoint rollouts should call now."""

    def train_step(self, rows: Sequence[TrainRow]) -> dict[str, float]:
        """One optimizer step on `rows`; returns metrics (loss, grad_norm, clip_frac, approx_kl, entropy, ...).
        Raises TrainingError (weights untouched) on a non-finite loss or a batch that does not fit."""

    def sync_weights(self) -> int:
        """Push the new weights to the policy endpoint; returns the new policy version."""

    def save(self, path: Path) -> None:
        """Write everything needed to resume (weights, optimizer, scheduler, version) into directory `path`."""

    def load(self, path: Path) -> None:
        """Restore what `save` wrote; afterwards the policy endpoint serves the restored weights."""

    def shutdown(self) -> None:
        """Stop servers, free memory. Safe to call twice."""


class RecordingBackend:
    """A backend that trains nothing: it records the rows it was given and serves a fixed endpoint.

    For loop tests against the fake upstream. `fail_at_step` makes train_step raise TrainingError (as a NaN
    loss would) at that 1-based step count; `step_delay_s` sleeps inside train_step (to kill it mid-step).
    """

    name = "recording"

    def __init__(self, base_url: str, model: str = "default", *, fail_at_step: int | None = None,
                 step_delay_s: float = 0.0) -> None:
        self.base_url, self.model = base_url, model
        self.fail_at_step, self.step_delay_s = fail_at_step, step_delay_s
        self.steps_done = 0
        self.version = 0
        self.batches: list[list[TrainRow]] = []
        self.closed = False

    def setup(self, config: TrainConfig) -> None:
        self.config = config

    def policy_endpoint(self) -> PolicyEndpoint:
        return PolicyEndpoint(self.base_url, self.model, self.version)

    def train_step(self, rows: Sequence[TrainRow]) -> dict[str, float]:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.fail_at_step is not None and self.steps_done + 1 == self.fail_at_step:
            raise TrainingError(f"loss is NaN at backend step {self.fail_at_step}")
        self.steps_done += 1
        self.batches.append(list(rows))
        trained = sum(r.num_trained_tokens for r in rows)
        return {"loss": 0.0, "grad_norm": 0.0, "train/trained_tokens": float(trained)}

    def sync_weights(self) -> int:
        self.version += 1
        return self.version

    def save(self, path: Path) -> None:
        (Path(path) / "recording_backend.json").write_text(
            json.dumps({"steps_done": self.steps_done, "version": self.version})
        )

    def load(self, path: Path) -> None:
        state = json.loads((Path(path) / "recording_backend.json").read_text())
        self.steps_done, self.version = state["steps_done"], state["version"]

    def shutdown(self) -> None:
        self.closed = True


def create_backend(name: str, config: TrainConfig) -> Backend:
    """Build the backend registered under `name` (through the `rllm_register_backends` hook)."""
    from rllm_core.plugins import get_plugin_manager

    specs = get_plugin_manager().backends()
    if name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(f"unknown backend {name!r}; installed backends: {known} (see `rllm plugins`)")
    backend = specs[name].factory(config)
    if not isinstance(backend, Backend):
        raise ConfigError(f"backend {name!r} factory returned {type(backend).__name__}, which lacks the Backend "
                          "methods (setup, policy_endpoint, train_step, sync_weights, save, load, shutdown)")
    return backend
