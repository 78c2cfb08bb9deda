"""The episode context: which episode (session) and which agent an LLM call made right now belongs to.

It lives in contextvars, which asyncio tasks, `asyncio.to_thread` and LangGraph's executor carry, but
`loop.run_in_executor`, raw threads and `ThreadPoolExecutor.submit` do not: `bind_context` and `submit`
carry it across those.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from rllm_core.types import Step

__all__ = [
    "AGENT_HEADER",
    "SESSION_HEADER",
    "EpisodeContext",
    "StepRecorder",
    "agent_scope",
    "bind_context",
    "current_agent",
    "current_episode",
    "episode_scope",
    "submit",
]

AGENT_HEADER = "X-RLLM-Agent"
"""HTTP header naming the agent/role that made a call; the gateway puts it in `Step.agent`."""
SESSION_HEADER = "X-RLLM-Session"
"""HTTP header naming the episode session, for clients that cannot use the /sessions/<id>/v1 URL."""

P = ParamSpec("P")
R = TypeVar("R")


class StepRecorder:
    """A thread-safe list of Steps captured in-process for one episode."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: list[Step] = []

    def record(self, step: Step) -> None:
        with self._lock:
            self._steps.append(step)
        from rllm_core.plugins import get_plugin_manager  # late: plugins import adapters lazily

        get_plugin_manager().emit("rllm_on_llm_call", step=step)

    def steps(self) -> list[Step]:
        with self._lock:
            return list(self._steps)


@dataclass
class EpisodeContext:
    """What an LLM call needs to know to be attributed: the session it belongs to and where to record it."""

    session_id: str
    recorder: StepRecorder = field(default_factory=StepRecorder)
    gateway_url: str | None = None
    """Calls to this URL are recorded by the gateway itself; in-process capture skips them."""
    tokenizer: Any = None
    """Used to retokenize calls to upstreams that return no token ids (marked token_source='retokenized')."""
    adhoc: bool = False
    """True for an episode an adapter opened itself (its agent ran outside `@rllm.rollout`)."""


_episode: contextvars.ContextVar[EpisodeContext | None] = contextvars.ContextVar(
    "rllm_episode", default=None
)
_agent: contextvars.ContextVar[str | None] = contextvars.ContextVar("rllm_agent", default=None)


def current_episode() -> EpisodeContext | None:
    return _episode.get()


def current_agent() -> str | None:
    return _agent.get()


@contextmanager
def episode_scope(ctx: EpisodeContext) -> Iterator[EpisodeContext]:
    token = _episode.set(ctx)
    try:
        yield ctx
    finally:
        _episode.reset(token)


@contextmanager
def agent_scope(name: str | None) -> Iterator[None]:
    """Attribute the LLM calls made inside this block to the agent/role `name`."""
    token = _agent.set(name)
    try:
        yield
    finally:
        _agent.reset(token)


def bind_context(fn: Callable[P, R]) -> Callable[P, R]:
    """Return `fn` bound to a copy of the current context, for raw threads and `run_in_executor`."""
    ctx = contextvars.copy_context()

    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.run(fn, *args, **kwargs)

    return bound


def submit(executor: Executor, fn: Callable[..., R], *args: Any, **kwargs: Any) -> Future[R]:
    """`executor.submit` that carries the episode context into the worker thread."""
    return executor.submit(bind_context(fn), *args, **kwargs)
