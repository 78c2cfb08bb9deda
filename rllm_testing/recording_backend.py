"""A training backend that trains nothing, the double beside the Backend seam (rllm_train.backend): it
records the rows it is given and serves a fixed endpoint, for loop tests against the fake upstream."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllm_core.errors import TrainingError
from rllm_train.backend import BackendBase, BackendCapabilities, PolicyEndpoint, TrainStepResult

if TYPE_CHECKING:
    from rllm_train.config import TrainConfig
    from rllm_train.packing import TrainRow

__all__ = ["RecordingBackend"]


class RecordingBackend(BackendBase):
    """A backend that trains nothing: it records the rows it was given and serves a fixed endpoint.

    For loop tests against the fake upstream. `fail_at_step` makes train_step raise TrainingError (as a NaN
    loss would) at that 1-based step count; `step_delay_s` sleeps inside train_step (to kill it mid-step);
    `asynchronous` returns a Future from train_step (the update then runs in a thread), as a remote backend
    would; `replicas` serves the policy from several upstream URLs; `upstream` (a FakeUpstream) reports each synced
version, as a policy server would. `events` logs the lifecycle calls in order.
    """

    name = "recording"

    def __init__(self, base_url: str, model: str = "default", *, fail_at_step: int | None = None,
                 step_delay_s: float = 0.0, asynchronous: bool = False, replicas: Sequence[str] = (),
                 caps: BackendCapabilities | None = None, upstream: Any = None) -> None:
        self.base_url, self.model = base_url, model
        self.fail_at_step, self.step_delay_s = fail_at_step, step_delay_s
        self.asynchronous = asynchronous
        self.replicas = tuple(replicas)
        self.upstream = upstream
        """A FakeUpstream whose reported policy_version follows each sync (as a real policy server's does)."""
        self.trained_at: list[int] = []
        """The version the trainer held at each update (staleness checks)."""
        self.caps = caps or BackendCapabilities(async_train_step=asynchronous)
        self.steps_done = 0
        self.version = 0
        self.batches: list[list[TrainRow]] = []
        self.events: list[str] = []
        self.closed = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def capabilities(self) -> BackendCapabilities:
        return self.caps

    def setup(self, config: TrainConfig) -> None:
        self.config = config
        self.events.append("setup")

    def policy_endpoint(self) -> PolicyEndpoint:
        return PolicyEndpoint(self.base_url, self.model, self.version, replicas=self.replicas)

    def before_rollouts(self) -> None:
        self.events.append("before_rollouts")

    def after_rollouts(self) -> None:
        self.events.append("after_rollouts")

    def _update(self, rows: list[TrainRow]) -> dict[str, float]:
        self.trained_at.append(self.version)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if self.fail_at_step is not None and self.steps_done + 1 == self.fail_at_step:
            raise TrainingError(f"loss is NaN at backend step {self.fail_at_step}")
        self.steps_done += 1
        self.batches.append(rows)
        self.events.append("train_done")
        trained = sum(r.num_trained_tokens for r in rows)
        return {"loss": 0.0, "grad_norm": 0.0, "train/trained_tokens": float(trained)}

    def train_step(self, rows: Sequence[TrainRow]) -> TrainStepResult:
        self.events.append("train_step")
        if not self.asynchronous:
            return self._update(list(rows))
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="recording-backend")
        return self._pool.submit(self._update, list(rows))

    def sync_weights(self) -> int:
        self.version += 1
        if self.upstream is not None:
            self.upstream.policy_version = self.version
        self.events.append("sync_weights")
        return self.version

    def save(self, path: Path) -> None:
        (Path(path) / "recording_backend.json").write_text(
            json.dumps({"steps_done": self.steps_done, "version": self.version})
        )

    def load(self, path: Path) -> None:
        file = Path(path) / "recording_backend.json"
        if not file.is_file():
            raise TrainingError(f"checkpoint {path} has no recording_backend.json; it was not written by this "
                                "backend")
        state = json.loads(file.read_text())
        self.steps_done, self.version = state["steps_done"], state["version"]

    def shutdown(self) -> None:
        self.closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


