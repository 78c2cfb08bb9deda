"""The machinery of one `run_episodes_ray` call: a job queue, worker slots, results and counts.

Ray runs the actors; this keeps each actor's call slots busy from one queue (so a dead worker strands no
backlog), notices deaths (`RayActorError` on a call), retries what was in flight, and replaces the actor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rich.progress import Progress

from rllm_core.context import report_llm_calls
from rllm_core.errors import ConfigError
from rllm_core.types import Episode, Task
from rllm_rollout.distributed.ray_worker import RolloutWorker, failed_episode_json
from rllm_rollout.engine import EngineStats, score_episode
from rllm_rollout.rollout import Rollout

if TYPE_CHECKING:
    from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["WORKER_START_TIMEOUT_S", "RayEpisodes", "RayRun", "RayRunStats", "RunJob"]

log = logging.getLogger("rllm.distributed")

WORKER_START_TIMEOUT_S = 120.0
"""How long a worker may take to be scheduled and start: longer means the cluster has no room for it."""
WORKER_DIED = "rollout worker {name} died while running this episode"


@dataclass
class RayRunStats:
    """What a Ray run cost beyond its episodes: read it from `RayEpisodes.stats` (or `as_dict()` for JSON)."""

    workers: int
    episodes: int = 0
    """Episodes returned (every task × attempt, lost ones included)."""
    retried: int = 0
    """Episode runs started again because their worker died with them in flight."""
    lost: int = 0
    """Episodes returned as errors because their worker died and no retry was left."""
    worker_deaths: int = 0
    replaced: int = 0
    """Dead workers replaced by a fresh actor (at most `workers` over a run)."""
    cpus_per_worker: float = 0.0
    concurrency_per_worker: int = 0
    by_worker: dict[str, int] = field(default_factory=dict)
    by_node: dict[str, int] = field(default_factory=dict)
    """Episodes finished on each Ray node (its address): which hosts did the work."""
    """Episodes finished by each actor ('worker0.0', its replacement 'worker0.1', ...)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RayEpisodes(list[Episode]):
    """The episodes in task order × attempts, as `run_episodes` returns them, plus the run's `stats`."""

    stats: RayRunStats

    def __init__(self, episodes: Sequence[Episode], stats: RayRunStats) -> None:
        super().__init__(episodes)
        self.stats = stats


@dataclass
class RunJob:
    index: int
    task: Task
    attempt: int
    tries: int = 0


@dataclass
class _Slot:
    """One worker position: its current actor (replaced when it dies) and whether it can take calls."""

    index: int
    actor: Any = None
    generation: int = 0
    up: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def name(self) -> str:
        return f"worker{self.index}.{self.generation}"


class RayRun:
    """The state of one run: the job queue, the worker slots, results and counts."""

    def __init__(self, ray: Any, ro: Rollout, jobs: list[RunJob], *, workers: int, per_worker: int, cpus: float,
                 worker_args: tuple[Any, ...], benchmark: Benchmark | None, retries: int,
                 on_episode: Callable[[Episode], None] | None, on_workers: Callable[[list[Any]], None] | None,
                 bar: Progress, stats: RayRunStats) -> None:
        self.ray, self.ro, self.jobs, self.retries = ray, ro, jobs, retries
        self.benchmark, self.on_episode, self.on_workers = benchmark, on_episode, on_workers
        self.actor_cls = ray.remote(num_cpus=cpus, max_concurrency=per_worker, max_restarts=0,
                                    max_task_retries=0)(RolloutWorker)
        self.worker_args = worker_args
        self.slots = [_Slot(i) for i in range(workers)]
        self.per_worker = per_worker
        self.results: list[Episode | None] = [None] * len(jobs)
        self.remaining = len(jobs)
        self.replacements_left = workers
        self.queue: asyncio.PriorityQueue[tuple[int, int, RunJob | None]] = asyncio.PriorityQueue()
        self.seq = itertools.count()
        self.live_lanes = workers * per_worker
        self.bar, self.stats, self.engine_stats = bar, stats, EngineStats(started=time.monotonic())
        self.nodes: dict[str, str] = {}
        self.bar_id = bar.add_task("", total=len(jobs), stats=self.engine_stats.line())

    async def _start(self, name: str) -> Any:
        """A new actor that answered `ready` and reaches the gateway, or a ConfigError saying why not."""
        try:
            actor = self.actor_cls.remote(*self.worker_args)
        except Exception as exc:  # pickling the rollout or gateway failed
            raise ConfigError(f"rollout {self.ro.name!r} cannot be sent to Ray workers ({type(exc).__name__}: "
                              f"{exc}); define it at module level in a module the workers can import") from None
        try:
            info = await asyncio.wait_for(actor.ready.remote(), WORKER_START_TIMEOUT_S)
        except asyncio.CancelledError:  # interrupted while it started: it must not outlive the run
            self.ray.kill(actor)
            raise
        except TimeoutError:
            self.ray.kill(actor)
            raise ConfigError(f"rollout worker {name} was not running after {WORKER_START_TIMEOUT_S:.0f} s: "
                              f"the cluster may have no room for it (free: {self.ray.available_resources()})"
                              ) from None
        except Exception as exc:
            self.ray.kill(actor)
            raise ConfigError(f"rollout worker {name} failed to start: {type(exc).__name__}: {exc}") from None
        self.nodes[name] = str(info.get("node", "?"))
        if info["gateway_error"]:
            self.ray.kill(actor)
            raise ConfigError(f"rollout worker {name} on {info['host']} cannot reach the gateway "
                              f"({info['gateway_error']}); serve the gateway on an address the cluster's "
                              "nodes can reach")
        return actor

    def _live_actors(self) -> list[Any]:
        return [s.actor for s in self.slots if s.actor is not None]

    async def start(self) -> None:
        started = await asyncio.gather(*(self._start(s.name) for s in self.slots), return_exceptions=True)
        for slot, actor in zip(self.slots, started, strict=True):
            if not isinstance(actor, BaseException):
                slot.actor = actor
                slot.up.set()
        errors = [e for e in started if isinstance(e, BaseException)]
        if errors:
            self.stop()
            raise errors[0]
        if self.on_workers is not None:
            self.on_workers(self._live_actors())

    def stop(self) -> None:
        for slot in self.slots:
            if slot.actor is not None:
                self.ray.kill(slot.actor)
                slot.actor = None

    async def _finish(self, job: RunJob, ep: Episode) -> None:
        if self.benchmark is not None:
            await score_episode(self.benchmark, job.task, ep)
        self.results[job.index] = ep
        self.stats.episodes += 1
        self.engine_stats.add(ep)
        self.bar.update(self.bar_id, advance=1, stats=self.engine_stats.line())
        if self.on_episode is not None:
            self.on_episode(ep)
        self.remaining -= 1
        if self.remaining == 0:
            for _ in range(len(self.slots) * self.per_worker):
                self.queue.put_nowait((2, next(self.seq), None))

    def _error_episode(self, job: RunJob, error: str) -> Episode:
        return Episode.model_validate_json(failed_episode_json(job.task.model_dump_json(), job.attempt,
                                                               self.ro.name, error))

    async def _worker_died(self, slot: _Slot, generation: int, job: RunJob, exc: BaseException) -> bool:
        """Retry or record the job, then replace the dead actor once; False when the slot has no actor now."""
        if job.tries < self.retries:
            job.tries += 1
            self.stats.retried += 1
            self.queue.put_nowait((0, next(self.seq), job))  # ahead of new work: it is the oldest
        else:
            self.stats.lost += 1
            died = WORKER_DIED.format(name=f"worker{slot.index}.{generation}")
            await self._finish(job, self._error_episode(job, f"{died} (retries spent: {job.tries}): {exc}"))
        async with slot.lock:
            if slot.generation != generation:  # another call of the same actor already handled its death
                return slot.actor is not None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            then = "are run again" if self.retries else "come back as errors"
            log.warning("rollout worker %s died (%s); its in-flight episodes %s", slot.name, first, then)
            self.stats.worker_deaths += 1
            slot.up.clear()
            if slot.actor is not None:  # an actor merely unreachable must not go on running episodes
                self.ray.kill(slot.actor)
            slot.actor, slot.generation = None, slot.generation + 1
            if self.replacements_left > 0 and self.remaining > 0:
                self.replacements_left -= 1
                try:
                    slot.actor = await self._start(slot.name)
                    self.stats.replaced += 1
                except ConfigError as err:
                    log.warning("could not replace rollout worker %s: %s", slot.name, err)
            slot.up.set()
            if slot.actor is not None and self.on_workers is not None:
                self.on_workers(self._live_actors())
            return slot.actor is not None

    async def _lane(self, slot: _Slot) -> None:
        """One call slot of one worker: take a job, run it there, hand the episode back; until done."""
        await self._lane_loop(slot)  # not in a `finally`: a cancelled run must not score leftovers
        self.live_lanes -= 1
        if self.live_lanes == 0 and self.remaining > 0:
            await self._give_up()

    async def _lane_loop(self, slot: _Slot) -> None:
        while True:
            await slot.up.wait()
            if slot.actor is None:
                return
            _, _, job = await self.queue.get()
            if job is None:
                return
            if not slot.up.is_set() or slot.actor is None:  # it died while we waited: not this job's fault
                self.queue.put_nowait((0, next(self.seq), job))
                continue
            actor, generation, name = slot.actor, slot.generation, slot.name
            try:
                text = await actor.run.remote(job.task.model_dump_json(), job.attempt)
                ep = Episode.model_validate_json(text)
            except self.ray.exceptions.RayActorError as exc:
                if not await self._worker_died(slot, generation, job, exc):
                    return
                continue
            except Exception as exc:  # a Ray task error that is not the worker's death
                ep = self._error_episode(job, "".join(traceback.format_exception(exc)))
            report_llm_calls(ep.steps)  # here, in the driver, once per Step: the worker sent none
            self.stats.by_worker[name] = self.stats.by_worker.get(name, 0) + 1
            node = self.nodes.get(name, "?")
            self.stats.by_node[node] = self.stats.by_node.get(node, 0) + 1
            await self._finish(job, ep)

    async def _give_up(self) -> None:
        """No worker is left: every job still queued becomes an error episode that says so."""
        while not self.queue.empty():
            _, _, job = self.queue.get_nowait()
            if job is not None:
                self.stats.lost += 1
                await self._finish(job, self._error_episode(job, "no rollout worker was left alive to run "
                                                                 "this episode (every worker died)"))

    async def run(self, description: str) -> RayEpisodes:
        self.bar.update(self.bar_id, description=description)
        for job in self.jobs:
            self.queue.put_nowait((1, next(self.seq), job))
        with self.bar:
            await self.start()
            lanes = [asyncio.create_task(self._lane(s)) for s in self.slots for _ in range(self.per_worker)]
            try:
                await asyncio.gather(*lanes)
            finally:
                for lane in lanes:
                    lane.cancel()
                self.stop()
        return RayEpisodes([ep for ep in self.results if ep is not None], self.stats)
