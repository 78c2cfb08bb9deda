"""`run_episodes_ray`: the rollout engine's contract, with episodes running in Ray actors.

Same inputs and output as `rllm_rollout.engine.run_episodes` (episodes in task order × attempts, a crashing
episode returned with its error, scoring by the benchmark in the driver), but each episode runs in one of
`workers` async Ray actors that record through the driver's gateway (a `RemoteGateway`). Ray schedules
and runs the actors; the driver only keeps each actor's slots busy (ceil(concurrency / workers) calls in
flight per actor) from one queue, so a worker that dies loses just the calls it had in flight, not a
backlog queued on it. Those are retried (`retries` times, on a replacement or a live worker); an episode
whose retries are spent is returned as an error episode saying its worker died. Plugins: each episode's
`rllm_on_episode_end` runs in its worker, `rllm_on_llm_call` in the driver, once per Step that comes back.

    with connect_ray(None, num_cpus=2):
        eps = asyncio.run(run_episodes_ray(rollout, tasks, workers=2, gateway=gw.remote(), model="m"))
    eps.stats.retried, eps.stats.lost                     # a RayEpisodes: a list with .stats
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rllm_core.errors import ConfigError
from rllm_core.types import Episode, Task
from rllm_rollout.distributed.ray_cluster import import_ray
from rllm_rollout.distributed.ray_run import RayEpisodes, RayRun, RayRunStats, RunJob
from rllm_rollout.rollout import Rollout, as_rollout

if TYPE_CHECKING:
    from rllm_rollout.benchmarks.base import Benchmark
    from rllm_rollout.gateway.client import GatewayClient

__all__ = ["CPU_SHARE", "RayEpisodes", "RayRunStats", "run_episodes_ray"]


CPU_SHARE = 0.5
"""The share of the cluster's CPUs rollout workers reserve by default: they mostly wait on HTTP, and the
rest stays free for what else runs on the cluster (a trainer, graders, the next run's workers)."""


def _worker_cpus(ray: Any, workers: int, requested: float | None) -> float:
    """Fractional CPUs per actor, from the cluster's total (not what is free at this instant, which lags
    behind actors just killed): at most 1 each, CPU_SHARE of the cluster in all, so N workers fit on 2 cores."""
    if requested is not None:
        if requested < 0:
            raise ConfigError(f"num_cpus_per_worker must be 0 or more (got {requested})")
        return requested
    total = float(ray.cluster_resources().get("CPU", 0.0))
    return min(1.0, math.floor(total * CPU_SHARE / workers * 100) / 100)


async def run_episodes_ray(
    rollout: Rollout | Callable[..., Any],
    tasks: Sequence[Task],
    *,
    workers: int,
    gateway: GatewayClient,
    model: str = "default",
    attempts: int = 1,
    concurrency: int = 16,
    sampling: dict[str, Any] | None = None,
    benchmark: Benchmark | None = None,
    timeout_s: float | None = None,
    progress: bool = True,
    on_episode: Callable[[Episode], None] | None = None,
    description: str | None = None,
    api_key: str | None = None,
    retries: int = 1,
    tokenizer: str | None = None,
    num_cpus_per_worker: float | None = None,
    on_workers: Callable[[list[Any]], None] | None = None,
) -> RayEpisodes:
    """Run `rollout` on every task `attempts` times in `workers` Ray actors; episodes in task order.

    Call it inside `connect_ray(...)`. `gateway` must be reachable from the workers: a `RemoteGateway`
    (`GatewayHandle.remote()`); it holds the upstream and its key, so `api_key` is passed to `arun` only
    for parity with `run_episodes`. `tokenizer` is a path or hub name (it travels to the workers).
    `concurrency` is split across workers (ceil(concurrency / workers) calls each); each worker reserves
    `num_cpus_per_worker` CPUs (default: CPU_SHARE of the cluster's CPUs shared out, at most 1). A worker that dies
    costs its in-flight episodes: each is run again up to `retries` times, then returned as an error
    episode; the counts are in the result's `.stats`. `on_workers` is called with the live actor handles
    when the workers are up and after each replacement (for monitoring, and tests that kill one).
    Raises ConfigError before any episode when a worker cannot start or cannot reach the gateway.
    """
    if attempts < 1 or concurrency < 1 or workers < 1:
        raise ConfigError(f"workers, attempts and concurrency must be at least 1 "
                          f"(got {workers}, {attempts}, {concurrency})")
    if retries < 0:
        raise ConfigError(f"retries must be 0 or more (got {retries})")
    ray = import_ray()
    if not ray.is_initialized():
        raise ConfigError("run_episodes_ray needs a Ray connection: call it inside `with connect_ray(address):`")
    ro = as_rollout(rollout)
    pairs = [(task, attempt) for task in tasks for attempt in range(attempts)]
    jobs = [RunJob(i, task, attempt) for i, (task, attempt) in enumerate(pairs)]
    per_worker = max(1, math.ceil(concurrency / workers))
    cpus = _worker_cpus(ray, workers, num_cpus_per_worker)
    stats = RayRunStats(workers=workers, cpus_per_worker=cpus, concurrency_per_worker=per_worker)
    if not jobs:
        return RayEpisodes([], stats)
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not progress, transient=False)
    run = RayRun(ray, ro, jobs, workers=workers, per_worker=per_worker, cpus=cpus,
                 worker_args=(ro, gateway, model, sampling, timeout_s, api_key, tokenizer), benchmark=benchmark,
                 retries=retries, on_episode=on_episode, on_workers=on_workers, bar=bar, stats=stats)
    return await run.run(description or f"{ro.name} · ray×{workers}")
