"""Upstream choice: a session sticks to one worker (its prefix cache stays warm); new sessions go to the
least loaded worker (fewest calls in flight, then fewest sessions).

The set of workers can be replaced while the gateway serves (`replace`): a training backend whose replicas
move after a weight sync (verl's vLLM/SGLang servers) hands the gateway the new set. Calls in flight finish on
the worker they started on; sessions whose worker is gone are re-assigned on their next call."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from rllm_rollout.gateway.config import UpstreamConfig

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

    def replace(self, upstreams: list[Upstream]) -> None:
        """Serve from `upstreams` from now on. Workers whose URL stays keep their sessions and load counts."""
        if not upstreams:
            raise ValueError("the gateway needs at least one upstream")
        with self._lock:
            kept = {u.url: u for u in self.upstreams}
            new = [kept.get(u.url) or u for u in upstreams]
            for u, fresh in zip(new, upstreams, strict=True):
                if u is not fresh:  # same URL: keep its counters, take the new settings (key, tokenizer)
                    u.config, u.tokenizer = fresh.config, fresh.tokenizer
            alive = {id(u) for u in new}
            for sid in [sid for sid, u in self._sticky.items() if id(u) not in alive]:
                del self._sticky[sid]
            self.upstreams = new

    def _least_loaded(self) -> Upstream:
        return min(self.upstreams, key=lambda u: (u.in_flight, u.sessions))

    def forget(self, session_id: str) -> None:
        with self._lock:
            up = self._sticky.pop(session_id, None)
            if up is not None:
                up.sessions -= 1
