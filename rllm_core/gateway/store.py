"""In-memory, thread-safe store of recorded Steps by session: the gateway writes from its event loop,
rollouts read and free from their own threads."""

from __future__ import annotations

import threading

from rllm_core.types import Step

__all__ = ["SessionStore"]


class SessionStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[str, list[Step]] = {}

    def add(self, session_id: str, steps: list[Step]) -> None:
        with self._lock:
            self._steps.setdefault(session_id, []).extend(steps)

    def steps(self, session_id: str) -> list[Step]:
        """A copy of the session's steps, in the order they were recorded."""
        with self._lock:
            return list(self._steps.get(session_id, ()))

    def take(self, session_id: str) -> list[Step]:
        """Return the session's steps and free them."""
        with self._lock:
            return self._steps.pop(session_id, [])

    def delete(self, session_id: str) -> int:
        with self._lock:
            return len(self._steps.pop(session_id, []))

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._steps)
