"""The rollout executor seam: where a batch of episodes runs — in this process, or in Ray actors.

`rllm train` and `rllm eval` describe a batch once (`EpisodeBatch`: the rollout, the tasks × attempts, the
sampling, where calls go) and hand it to an executor; neither knows how episodes are spread out. Two
implementations ship:

- `LocalExecutor`: `rllm_rollout.engine.run_episodes` in this process's event loop (the default);
- `RayExecutor`: `rllm_rollout.distributed.run_episodes_ray` in `workers` Ray actors, recording through a
  gateway in this process that the workers can reach (`--rollout-workers N`, `--ray-address`).

`open_executor(workers, ray_address)` picks one for the duration of a `with` block (connecting to Ray, and
leaving it, only for the second). `rllm_testing.executor.SequentialExecutor` is the double beside the seam.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rllm_core.types import Episode, Task
from rllm_rollout.rollout import Rollout

if TYPE_CHECKING:
    from rllm_rollout.benchmarks.base import Benchmark
    from rllm_rollout.distributed import RayConnection
    from rllm_rollout.gateway import GatewayHandle, RemoteGateway

__all__ = ["EpisodeBatch", "LocalExecutor", "RayExecutor", "RolloutExecutor", "open_executor"]


@dataclass(frozen=True)
class EpisodeBatch:
    """One batch of episodes: `rollout` on every task `attempts` times, at most `concurrency` at once.

    Calls go through `gateway` (a gateway in this process: training's, which the backend's replicas sit behind; or
    a `RemoteGateway`, one on a host of its own) or, without one, to `base_url` with `api_key` (eval against an
    endpoint). Episodes come back in task order × attempts, scored by `benchmark` when given; `on_episode` sees
    each as it finishes."""

    rollout: Rollout
    tasks: Sequence[Task]
    model: str = "default"
    gateway: GatewayHandle | RemoteGateway | None = None
    base_url: str | None = None
    api_key: str | None = None
    attempts: int = 1
    concurrency: int = 16
    sampling: dict[str, Any] | None = None
    benchmark: Benchmark | None = None
    timeout_s: float | None = None
    tokenizer: Any = None
    progress: bool = False
    description: str | None = None
    on_episode: Callable[[Episode], None] | None = None


@runtime_checkable
class RolloutExecutor(Protocol):
    """Runs batches of episodes. `gateway_host` is where a gateway the executor's workers must reach binds
    (loopback unless workers run on other machines), read by whoever starts the run's gateway."""

    gateway_host: str

    async def run(self, batch: EpisodeBatch) -> list[Episode]:
        """The batch's episodes, in task order × attempts; a failing episode comes back with its error."""
        ...


class LocalExecutor:
    """Episodes in this process's event loop (`run_episodes`)."""

    gateway_host = "127.0.0.1"

    async def run(self, batch: EpisodeBatch) -> list[Episode]:
        from rllm_rollout.engine import run_episodes

        return await run_episodes(
            batch.rollout, list(batch.tasks), base_url=batch.base_url, model=batch.model, gateway=batch.gateway,
            api_key=batch.api_key, attempts=batch.attempts, concurrency=batch.concurrency, sampling=batch.sampling,
            benchmark=batch.benchmark, timeout_s=batch.timeout_s, progress=batch.progress,
            on_episode=batch.on_episode, description=batch.description, tokenizer=batch.tokenizer)


@dataclass
class RayExecutor:
    """Episodes in `workers` Ray actors of the connected cluster (`run_episodes_ray`), recorded through a gateway
    in this process; `stats` keeps running totals over every batch (episodes retried and lost, worker deaths)."""

    workers: int
    connection: RayConnection
    stats: dict[str, int] = field(default_factory=lambda: {"retried": 0, "lost": 0, "worker_deaths": 0})
    last: dict[str, Any] = field(default_factory=dict)
    """The latest batch's own figures (workers, CPUs each, episodes per worker, retried, lost, ...)."""

    @property
    def gateway_host(self) -> str:
        from rllm_rollout.distributed.ray_gateway import worker_gateway_host

        return worker_gateway_host(self.connection)

    async def run(self, batch: EpisodeBatch) -> list[Episode]:
        from rllm_rollout.distributed import run_episodes_ray

        with self._gateway(batch) as gateway:
            episodes = await run_episodes_ray(
                batch.rollout, list(batch.tasks), workers=self.workers, gateway=gateway, model=batch.model,
                attempts=batch.attempts, concurrency=batch.concurrency, sampling=batch.sampling,
                benchmark=batch.benchmark, timeout_s=batch.timeout_s, progress=batch.progress,
                on_episode=batch.on_episode, api_key=batch.api_key,
                description=batch.description and f"{batch.description} · ray×{self.workers}")
        for key in self.stats:
            self.stats[key] += getattr(episodes.stats, key)
        self.last = episodes.stats.as_dict()
        return list(episodes)

    @contextlib.contextmanager
    def _gateway(self, batch: EpisodeBatch) -> Iterator[Any]:
        """The client workers record through: the batch's gateway, or one for its base URL. On one machine the
        shared gateway on 127.0.0.1 serves; a cluster with other nodes gets a gateway of its own on every
        interface, behind a random bearer token, at this node's cluster address."""
        from rllm_rollout.distributed import worker_gateway_bind, worker_gateway_client
        from rllm_rollout.gateway import RemoteGateway, UpstreamConfig, shared_gateway, start_gateway

        if isinstance(batch.gateway, RemoteGateway):  # a gateway host of its own (`--gateway`): same URL everywhere
            yield batch.gateway
            return
        if batch.gateway is not None:
            yield worker_gateway_client(batch.gateway, self.connection)
            return
        if batch.base_url is None:
            raise ValueError("an EpisodeBatch needs a gateway or a base_url")
        upstream = UpstreamConfig(url=batch.base_url, api_key=batch.api_key)
        if self.connection.single_node:
            yield shared_gateway([upstream]).remote()
            return
        host, token = worker_gateway_bind(self.connection)
        own = start_gateway([upstream], host=host, api_key=token)
        try:
            yield worker_gateway_client(own, self.connection)
        finally:
            own.stop()


@contextlib.contextmanager
def open_executor(workers: int = 0, ray_address: str | None = None) -> Iterator[LocalExecutor | RayExecutor]:
    """The executor for `--rollout-workers workers` (0: this process) and `--ray-address`, for a `with` block:
    with workers, Ray is connected on entry (a local cluster when no address) and left on exit."""
    if workers <= 0:
        yield LocalExecutor()
        return
    from rllm_rollout.distributed import connect_ray

    with connect_ray(ray_address) as connection:
        yield RayExecutor(workers, connection)
