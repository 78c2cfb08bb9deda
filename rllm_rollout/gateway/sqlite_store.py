"""A gateway store in a SQLite file: recorded Steps (and which sessions are closed) survive a gateway restart.

`rllm gateway --store sqlite:PATH`, or `start_gateway(..., store="sqlite:PATH")`. Same lifecycle as the
in-memory store (store.py): closed sessions, TTLs, bounds, take replies kept for a retry.

Stdlib `sqlite3`, synchronous, not aiosqlite: the `Store` protocol is synchronous because rollouts take from
their own threads and the gateway records from its event loop; a WAL-mode write of one step is tens of
microseconds, less than the event-loop hop aiosqlite's worker thread would add, and it needs no dependency.
One connection behind a lock serves every thread; `synchronous=NORMAL` in WAL keeps every committed step across
a process crash or restart (only a power loss may lose the last ones). Several processes may share one file
(SQLite locks it; `busy_timeout` waits), though the `max_sessions` bound is then counted per process.

Times are wall-clock (`time.time`), unlike the memory store's monotonic clock, so TTLs mean the same after a
restart.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from pydantic import TypeAdapter

from rllm_core.errors import ConfigError
from rllm_core.types import Step
from rllm_rollout.gateway.config import StoreLimits
from rllm_rollout.gateway.store import COUNTERS, DEFAULT_SESSION, Clock, StoreStats, TakeResult, Warner

__all__ = ["SqliteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, last_active REAL NOT NULL, n_steps INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_last ON sessions (last_active);
CREATE TABLE IF NOT EXISTS steps (seq INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS steps_session ON steps (session_id, seq);
CREATE TABLE IF NOT EXISTS closed (id TEXT PRIMARY KEY, closed_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS closed_at ON closed (closed_at);
CREATE TABLE IF NOT EXISTS takes (session_id TEXT NOT NULL, take_id TEXT NOT NULL, taken_at REAL NOT NULL,
                                  in_flight INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (session_id, take_id));
CREATE INDEX IF NOT EXISTS takes_at ON takes (taken_at);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_SWEEP_EVERY_S = 1.0
"""Expiry runs at most this often (a few indexed DELETEs): TTLs are minutes to hours, so a second late is nothing."""


_STEPS = TypeAdapter(list[Step])


def _dump(steps: list[Step]) -> str:
    return "[" + ",".join(s.model_dump_json() for s in steps) + "]"


def _load(rows: list[tuple[str]]) -> list[Step]:
    return [Step.model_validate_json(data) for (data,) in rows]


class SqliteStore:
    """The `Store` protocol over one SQLite file (created with its tables on first use)."""

    def __init__(self, path: str | Path, limits: StoreLimits | None = None, *, clock: Clock = time.time) -> None:
        self.limits = limits or StoreLimits()
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open the gateway store {self.path}: {exc}; choose a writable path "
                              "(--store sqlite:PATH)") from exc
        self._next_sweep = float("-inf")
        self._warn = Warner()
        (self._n_open,) = self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()
        (self._n_closed,) = self._db.execute("SELECT COUNT(*) FROM closed").fetchone()

    def __repr__(self) -> str:
        return f"<SqliteStore {self.path}>"

    # ------------------------------------------------------------------ helpers (called with the lock held)
    def _bump(self, counter: str, n: int, message: str | None = None) -> None:
        if not n:
            return
        self._db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
                         (counter, n, n))
        if message is not None:
            (total,) = self._db.execute("SELECT value FROM counters WHERE name = ?", (counter,)).fetchone()
            self._warn(counter, total, message)

    def _drop_sessions(self, rows: list[tuple[str, int]]) -> None:
        self._db.executemany("DELETE FROM steps WHERE session_id = ?", [(sid,) for sid, _ in rows])
        self._db.executemany("DELETE FROM sessions WHERE id = ?", [(sid,) for sid, _ in rows])
        self._n_open -= len(rows)

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(_SWEEP_EVERY_S, self.limits.session_ttl_s / 10)
        lim = self.limits
        rows = self._db.execute("SELECT id, n_steps FROM sessions WHERE last_active <= ?",
                                (now - lim.session_ttl_s,)).fetchall()
        if rows:
            self._drop_sessions(rows)
            self._bump("expired_steps", sum(n for _, n in rows))
            for sid, n in rows:
                self._bump("expired_sessions", 1, f"session {sid} expired after {lim.session_ttl_s:g} s idle "
                                                  f"with {n} step(s) never taken: dropped")
        self._n_closed -= self._db.execute("DELETE FROM closed WHERE closed_at <= ?",
                                           (now - lim.closed_ttl_s,)).rowcount
        self._db.execute("DELETE FROM takes WHERE taken_at <= ?", (now - lim.take_grace_s,))

    def _close(self, session_id: str, now: float) -> None:
        if session_id == DEFAULT_SESSION:
            return
        if not self._db.execute("UPDATE closed SET closed_at = ? WHERE id = ?", (now, session_id)).rowcount:
            self._db.execute("INSERT INTO closed VALUES (?, ?)", (session_id, now))
            self._n_closed += 1
        if self._n_closed > self.limits.max_closed:
            excess = self._n_closed - self.limits.max_closed
            self._n_closed -= self._db.execute("DELETE FROM closed WHERE id IN (SELECT id FROM closed ORDER BY "
                                               "closed_at LIMIT ?)", (excess,)).rowcount
            self._bump("forgotten_closed", excess, f"more than {self.limits.max_closed} closed sessions: the "
                                                   "oldest are forgotten (raise max_closed)")

    def _pop(self, session_id: str) -> list[Step]:
        steps = _load(self._db.execute("SELECT data FROM steps WHERE session_id = ? ORDER BY seq",
                                       (session_id,)).fetchall())
        if self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount:
            self._n_open -= 1
        self._db.execute("DELETE FROM steps WHERE session_id = ?", (session_id,))
        return steps

    # ------------------------------------------------------------------ the Store protocol
    def add(self, session_id: str, steps: list[Step]) -> int:
        rows = [(session_id, s.model_dump_json()) for s in steps]
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            now = self._clock()
            self._sweep(now)
            if self._db.execute("SELECT 1 FROM closed WHERE id = ?", (session_id,)).fetchone():
                self._bump("late_steps", len(steps), f"{len(steps)} step(s) for session {session_id} arrived "
                                                     "after it was taken: dropped")
                return len(steps)
            updated = self._db.execute("UPDATE sessions SET last_active = ?, n_steps = n_steps + ? WHERE id = ?",
                                       (now, len(steps), session_id)).rowcount
            if not updated:
                self._db.execute("INSERT INTO sessions VALUES (?, ?, ?)", (session_id, now, len(steps)))
                self._n_open += 1
                if self._n_open > self.limits.max_sessions:
                    old = self._db.execute("SELECT id, n_steps FROM sessions WHERE id != ? ORDER BY last_active "
                                           "LIMIT 1", (session_id,)).fetchall()
                    self._drop_sessions(old)
                    for sid, n in old:
                        self._bump("evicted_steps", n)
                        self._bump("evicted_sessions", 1, f"more than {self.limits.max_sessions} open sessions: "
                                                          f"the least recently active ({sid}, {n} step(s)) is dropped")
            self._db.executemany("INSERT INTO steps (session_id, data) VALUES (?, ?)", rows)
            self._bump("recorded_steps", len(rows))
            if session_id == DEFAULT_SESSION:
                (n,) = self._db.execute("SELECT n_steps FROM sessions WHERE id = ?", (session_id,)).fetchone()
                excess = n - self.limits.max_default_steps
                if excess > 0:
                    self._db.execute("DELETE FROM steps WHERE seq IN (SELECT seq FROM steps WHERE session_id = ? "
                                     "ORDER BY seq LIMIT ?)", (session_id, excess))
                    self._db.execute("UPDATE sessions SET n_steps = ? WHERE id = ?",
                                     (self.limits.max_default_steps, session_id))
                    self._bump("default_dropped_steps", excess,
                               f"the default session holds more than {self.limits.max_default_steps} steps: the "
                               "oldest are dropped (give each agent a session, or take the default one)")
            return 0

    def steps(self, session_id: str) -> list[Step]:
        with self._lock:
            return _load(self._db.execute("SELECT data FROM steps WHERE session_id = ? ORDER BY seq",
                                          (session_id,)).fetchall())

    def take(self, session_id: str, *, take_id: str | None = None, in_flight: int = 0) -> TakeResult:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            now = self._clock()
            self._sweep(now)
            if take_id is not None:
                kept = self._db.execute("SELECT in_flight, data FROM takes WHERE session_id = ? AND take_id = ?",
                                        (session_id, take_id)).fetchone()
                if kept is not None:
                    self._bump("retried_takes", 1)
                    return TakeResult(steps=_STEPS.validate_json(kept[1]), in_flight=kept[0], retried=True)
            steps = self._pop(session_id)
            self._close(session_id, now)
            if take_id is not None:
                self._db.execute("INSERT INTO takes VALUES (?, ?, ?, ?, ?)",
                                 (session_id, take_id, now, in_flight, _dump(steps)))
            return TakeResult(steps=steps, in_flight=in_flight)

    def ack(self, session_id: str, take_id: str) -> bool:
        with self._lock, self._db:
            return bool(self._db.execute("DELETE FROM takes WHERE session_id = ? AND take_id = ?",
                                         (session_id, take_id)).rowcount)

    def delete(self, session_id: str) -> int:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT n_steps FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is not None:
                self._db.execute("DELETE FROM steps WHERE session_id = ?", (session_id,))
                self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
                self._n_open -= 1
            self._close(session_id, self._clock())
            return row[0] if row is not None else 0

    def is_closed(self, session_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM closed WHERE id = ?", (session_id,)).fetchone() is not None

    def sessions(self) -> list[str]:
        with self._lock:
            return [sid for (sid,) in self._db.execute("SELECT id FROM sessions ORDER BY last_active")]

    def stats(self) -> StoreStats:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._next_sweep = float("-inf")
            self._sweep(self._clock())
            counts = dict.fromkeys(COUNTERS, 0)
            counts.update(self._db.execute("SELECT name, value FROM counters").fetchall())
            (n_open,) = self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()
            (n_closed,) = self._db.execute("SELECT COUNT(*) FROM closed").fetchone()
            (n_steps,) = self._db.execute("SELECT COUNT(*) FROM steps").fetchone()
            (n_takes,) = self._db.execute("SELECT COUNT(*) FROM takes").fetchone()
            self._n_open, self._n_closed = n_open, n_closed
            return StoreStats(open_sessions=n_open, closed_sessions=n_closed, stored_steps=n_steps,
                              kept_takes=n_takes, **counts)

    def client_token(self, new: str) -> str:
        """The gateway's generated client token, kept in the file: a gateway restarted on it without `--api-key`
        keeps the token its clients (RemoteGateway, agents mid-run) already hold, so their retries get through.
        `new` is stored when the file has none yet."""
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('client_token', ?)", (new,))
            (token,) = self._db.execute("SELECT value FROM meta WHERE key = 'client_token'").fetchone()
        return str(token)

    def close(self) -> None:
        with self._lock:
            self._db.close()
