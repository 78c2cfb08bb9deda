"""Upstream choice: a session sticks to one worker (its prefix cache stays warm); new sessions go to the
least loaded worker (fewest calls in flight, then fewest sessions)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from rllm_core.gateway.config import UpstreamConfig

__all__ = ["Upstream", "UpstreamRouter"]

_MAX_STICKY = 200_000


@dataclass(eq=False)
class Upstream:
    config: UpstreamConfig
    tokenizer: Any = None
    in_flight: int = 0
    sessions: int = 0

    @property
    def url(self) -> str:
        return self.config.url


class UpstreamRouter:
    def __init__(self, upstreams: list[Upstream]) -> None:
        self.upstreams = upstreams
        self._sticky: OrderedDict[str, Upstream] = OrderedDict()
        self._lock = threading.Lock()

    def pick(self, session_id: str | None) -> Upstream:
        if len(self.upstreams) == 1 or session_id is None:
            return self.upstreams[0] if len(self.upstreams) == 1 else self._least_loaded()
        with self._lock:
            up = self._sticky.get(session_id)
            if up is None:
                up = self._least_loaded()
                up.sessions += 1
                self._sticky[session_id] = up
                if len(self._sticky) > _MAX_STICKY:  # sessions nobody freed: forget the oldest
                    _, old = self._sticky.popitem(last=False)
                    old.sessions -= 1
            return up

    def _least_loaded(self) -> Upstream:
        return min(self.upstreams, key=lambda u: (u.in_flight, u.sessions))

    def forget(self, session_id: str) -> None:
        with self._lock:
            up = self._sticky.pop(session_id, None)
            if up is not None:
                up.sessions -= 1
