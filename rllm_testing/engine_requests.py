"""Submitting to the decode engine directly, without HTTP: a request's token events gathered per choice.

Tests of the engine (exactness, batching, eviction) and benchmarks/gpu/local_cuda.py use the same two pieces:
`TokenSink`, the callback a `GenerationRequest` streams its events into, and `submit`.
"""

from __future__ import annotations

import threading
from typing import Any

from rllm_serve.sampling import SamplingParams
from rllm_serve.sequence import GenerationRequest, TokenEvent

__all__ = ["TokenSink", "submit"]


class TokenSink:
    """A request's events; `done` is set once all `n` choices have finished."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, threading.Event()
        self.events: list[TokenEvent] = []

    def __call__(self, ev: TokenEvent) -> None:
        self.events.append(ev)
        if sum(e.finish_reason is not None for e in self.events) == self.n:
            self.done.set()

    def tokens(self, choice: int) -> list[int]:
        return [e.token_id for e in self.events if e.choice == choice and e.token_id is not None]

    def logprobs(self, choice: int) -> list[float]:
        return [e.logprob for e in self.events if e.choice == choice and e.token_id is not None]  # type: ignore[misc]

    def versions(self, choice: int) -> list[int]:
        return [e.policy_version for e in self.events if e.choice == choice and e.token_id is not None]


def submit(engine: Any, prompt: list[int], n: int = 1, **params: Any) -> TokenSink:
    """Queue `prompt` on `engine` (a DecodeEngine) with `params` as SamplingParams; the sink fills as it runs."""
    sink = TokenSink(n)
    engine.submit(GenerationRequest(list(prompt), SamplingParams(**params), sink, n=n))
    return sink
