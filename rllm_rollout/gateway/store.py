"""Where the gateway keeps recorded Steps by session, and the sessions' lifecycle.

The gateway writes from its event loop; rollouts read and take from their own threads, so every store is
thread-safe and synchronous (a write is microseconds, in memory or in SQLite's WAL). Two implementations of one
`Store` protocol, with the same lifecycle:

- A session is open from its first step until it is taken or deleted; then it is *closed*: steps that arrive
  for it later (a sync agent past its timeout, a call still streaming when its rollout returned) are dropped and
  counted as late, never re-creating the session. A closed session is remembered (a tombstone) for
  `closed_ttl_s`, at most `max_closed` of them.
- An open session idle for `session_ttl_s` is dropped; beyond `max_sessions` the least recently active one is.
  The `default` session (calls that name none) is never closed and keeps at most `max_default_steps`, the oldest
  dropped first. Every drop is counted in `stats()` and logged: nothing is lost silently.
- A take with a `take_id` keeps its reply for `take_grace_s` (or until `ack`), so a client whose reply was lost
  (a gateway restart, a reset connection) takes again with the same id and gets the same steps.

`MemoryStore` is the default; `SqliteStore` (gateway/sqlite_store.py) keeps everything in a file, so Steps
survive a gateway restart. `open_store("memory" | "sqlite:PATH")` builds either from a spec.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from rllm_core.types import Step
from rllm_rollout.gateway.config import StoreLimits

__all__ = ["DEFAULT_SESSION", "IN_FLIGHT_HEADER", "MemoryStore", "SessionStore", "Store", "StoreStats", "TakeResult"]

log = logging.getLogger("rllm.gateway")

DEFAULT_SESSION = "default"
"""Session of calls that name none (no prefix, no header): recorded, never silently dropped."""

IN_FLIGHT_HEADER = "X-RLLM-In-Flight"
"""On a take's reply: how many calls of the session were still in flight (their steps will be dropped as late)."""

Clock = Callable[[], float]


class TakeResult(BaseModel):
    """What a take returns: the session's Steps, and how many of its calls were still in flight at that moment
    (their steps arrive after the take and are dropped as late: the episode is missing them)."""

    model_config = ConfigDict(frozen=True)

    steps: list[Step]
    in_flight: int = 0
    retried: bool = False
    """True when this is the kept reply of an earlier take with the same take id."""


class StoreStats(BaseModel):
    """Counters of a store since it was created (a SQLite store's persist across restarts)."""

    open_sessions: int = 0
    closed_sessions: int = 0
    stored_steps: int = 0
    kept_takes: int = 0
    late_steps: int = 0
    """Steps recorded for a session after it was taken or deleted: dropped."""
    expired_sessions: int = 0
    expired_steps: int = 0
    """Open sessions (and their steps) dropped after `session_ttl_s` idle."""
    evicted_sessions: int = 0
    evicted_steps: int = 0
    """Open sessions (and their steps) dropped because there were more than `max_sessions`."""
    default_dropped_steps: int = 0
    """Oldest steps of the default session dropped beyond `max_default_steps`."""
    forgotten_closed: int = 0
    """Tombstones dropped beyond `max_closed` (a late step for one of them would open a new session)."""
    retried_takes: int = 0
    recorded_steps: int = 0
    """Steps accepted since the store was created, taken ones included (late ones not): what a run's episodes,
    with their steps, should add up to."""


COUNTERS = ("recorded_steps", "late_steps", "expired_sessions", "expired_steps", "evicted_sessions", "evicted_steps",
            "default_dropped_steps", "forgotten_closed", "retried_takes")


@runtime_checkable
class Store(Protocol):
    """The store a gateway records into. All methods are thread-safe."""

    limits: StoreLimits

    def add(self, session_id: str, steps: list[Step]) -> int:
        """Record steps; returns how many were dropped because the session is closed (0 normally)."""
        ...

    def steps(self, session_id: str) -> list[Step]:
        """A copy of an open session's steps, in recorded order ([] for a closed or unknown one)."""
        ...

    def take(self, session_id: str, *, take_id: str | None = None, in_flight: int = 0) -> TakeResult:
        """Return the session's steps, free them and close the session (the default session stays open).
        With a `take_id` the reply is kept for `take_grace_s`: the same take again returns it (`retried`)."""
        ...

    def ack(self, session_id: str, take_id: str) -> bool:
        """Forget a kept take reply (the client has it); False when there was none."""
        ...

    def delete(self, session_id: str) -> int:
        """Free the session's steps and close it; returns how many were freed."""
        ...

    def is_closed(self, session_id: str) -> bool: ...

    def sessions(self) -> list[str]:
        """The open sessions."""
        ...

    def stats(self) -> StoreStats: ...

    def close(self) -> None:
        """Release what the store holds open (a file); the in-memory store has nothing to release."""
        ...


class Warner:
    """Logs a warning when a drop counter reaches 1, 2, 4, 8, ...: every kind of loss is reported, and a
    long run that keeps overflowing does not write a line per call."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def __call__(self, counter: str, total: int, message: str) -> None:
        if total >= self._next.get(counter, 1):
            log.warning("%s (%d %s so far; see GET /stats)", message, total, counter.replace("_", " "))
            while self._next.get(counter, 1) <= total:
                self._next[counter] = self._next.get(counter, 1) * 2


@dataclass
class _Session:
    last: float
    steps: list[Step] = field(default_factory=list)


class MemoryStore:
    """The default store: dicts in this process, ordered by activity so expiry costs only what it drops."""

    def __init__(self, limits: StoreLimits | None = None, *, clock: Clock = time.monotonic) -> None:
        self.limits = limits or StoreLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Session] = OrderedDict()  # least recently active first
        self._closed: OrderedDict[str, float] = OrderedDict()  # session -> closed at, oldest first
        self._takes: OrderedDict[tuple[str, str], tuple[float, TakeResult]] = OrderedDict()
        self._n_steps = 0
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._warn = Warner()

    def __repr__(self) -> str:
        return f"<MemoryStore open={len(self._open)} closed={len(self._closed)}>"

    def _count(self, counter: str, n: int, message: str) -> None:
        if n:
            self._counts[counter] += n
            self._warn(counter, self._counts[counter], message)

    def _sweep(self, now: float) -> None:
        lim = self.limits
        while self._open:
            sid, s = next(iter(self._open.items()))
            if s.last > now - lim.session_ttl_s:
                break
            del self._open[sid]
            self._n_steps -= len(s.steps)
            self._counts["expired_steps"] += len(s.steps)
            self._count("expired_sessions", 1, f"session {sid} expired after {lim.session_ttl_s:g} s idle with "
                                               f"{len(s.steps)} step(s) never taken: dropped")
        while self._closed and next(iter(self._closed.values())) <= now - lim.closed_ttl_s:
            self._closed.popitem(last=False)
        while self._takes and next(iter(self._takes.values()))[0] <= now - lim.take_grace_s:
            self._takes.popitem(last=False)

    def _close(self, session_id: str, now: float) -> None:
        if session_id == DEFAULT_SESSION:
            return
        self._closed[session_id] = now
        self._closed.move_to_end(session_id)
        if len(self._closed) > self.limits.max_closed:
            self._closed.popitem(last=False)
            self._count("forgotten_closed", 1, f"more than {self.limits.max_closed} closed sessions: the oldest "
                                               "is forgotten (raise max_closed)")

    def add(self, session_id: str, steps: list[Step]) -> int:
        with self._lock:
            now = self._clock()
            self._sweep(now)
            if session_id in self._closed:
                self._count("late_steps", len(steps), f"{len(steps)} step(s) for session {session_id} arrived "
                                                      "after it was taken: dropped")
                return len(steps)
            s = self._open.get(session_id)
            if s is None:
                s = self._open[session_id] = _Session(now)
                if len(self._open) > self.limits.max_sessions:
                    old_sid, old = self._open.popitem(last=False)
                    self._n_steps -= len(old.steps)
                    self._counts["evicted_steps"] += len(old.steps)
                    self._count("evicted_sessions", 1,
                                f"more than {self.limits.max_sessions} open sessions: the least recently active "
                                f"({old_sid}, {len(old.steps)} step(s)) is dropped")
            else:
                self._open.move_to_end(session_id)
                s.last = now
            s.steps.extend(steps)
            self._n_steps += len(steps)
            self._counts["recorded_steps"] += len(steps)
            excess = len(s.steps) - self.limits.max_default_steps
            if session_id == DEFAULT_SESSION and excess > 0:
                del s.steps[:excess]
                self._n_steps -= excess
                self._count("default_dropped_steps", excess,
                            f"the default session holds more than {self.limits.max_default_steps} steps: the "
                            "oldest are dropped (give each agent a session, or take the default one)")
            return 0

    def steps(self, session_id: str) -> list[Step]:
        with self._lock:
            s = self._open.get(session_id)
            return list(s.steps) if s is not None else []

    def take(self, session_id: str, *, take_id: str | None = None, in_flight: int = 0) -> TakeResult:
        with self._lock:
            now = self._clock()
            self._sweep(now)
            if take_id is not None and (kept := self._takes.get((session_id, take_id))) is not None:
                self._counts["retried_takes"] += 1
                return kept[1].model_copy(update={"retried": True})
            s = self._open.pop(session_id, None)
            steps = s.steps if s is not None else []
            self._n_steps -= len(steps)
            self._close(session_id, now)
            result = TakeResult(steps=steps, in_flight=in_flight)
            if take_id is not None:
                self._takes[(session_id, take_id)] = (now, result)
            return result

    def ack(self, session_id: str, take_id: str) -> bool:
        with self._lock:
            return self._takes.pop((session_id, take_id), None) is not None

    def delete(self, session_id: str) -> int:
        with self._lock:
            now = self._clock()
            s = self._open.pop(session_id, None)
            n = len(s.steps) if s is not None else 0
            self._n_steps -= n
            self._close(session_id, now)
            return n

    def is_closed(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._closed

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def stats(self) -> StoreStats:
        with self._lock:
            self._sweep(self._clock())
            return StoreStats(open_sessions=len(self._open), closed_sessions=len(self._closed),
                              stored_steps=self._n_steps, kept_takes=len(self._takes), **self._counts)

    def close(self) -> None:
        return None


SessionStore = MemoryStore
"""The in-memory store's earlier name, kept for code that imports it."""
