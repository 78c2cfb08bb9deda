"""The episode context: which episode (session) and which agent an LLM call made right now belongs to.

It lives in contextvars, which asyncio tasks, `asyncio.to_thread` and LangGraph's executor carry, but
`loop.run_in_executor`, raw threads and `ThreadPoolExecutor.submit` do not: `bind_context` and `submit`
carry it across those.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from rllm_core.types import Step

__all__ = [
    "AGENT_HEADER",
    "SESSION_HEADER",
    "CallAgentName",
    "EpisodeContext",
    "StepRecorder",
    "agent_scope",
    "bind_context",
    "current_agent",
    "current_episode",
    "episode_scope",
    "report_llm_calls",
    "steps_reported_by_driver",
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
        """Keep `step` for its episode. No plugin event here: this may be a Ray worker, and the driver sends
        `rllm_on_llm_call` when the episode reaches it (`report_llm_calls`)."""
        with self._lock:
            self._steps.append(step)

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
_in_driver: contextvars.ContextVar[bool] = contextvars.ContextVar("rllm_in_driver", default=True)


def current_episode() -> EpisodeContext | None:
    return _episode.get()


class CallAgentName(str):
    """An agent name set for one LLM call by a callback handler, which may not be able to unset it.

    A framework that reports a call's end from another context than its start (LangChain's async chat models end
    in a task of their own) leaves the name set where the call was made. `end()` marks it over — the mark is
    seen from every context, being on the object — and from then on `current_agent()` looks past it to the name
    it covered (`previous`), so later calls of that context are not attributed to a call that has finished.
    """

    previous: str | None = None
    ended: bool = False

    @classmethod
    def covering(cls, name: str, previous: str | None) -> CallAgentName:
        marked = cls(name)
        marked.previous = previous
        return marked

    def end(self) -> None:
        self.ended = True


def current_agent() -> str | None:
    """The agent the next LLM call is attributed to (the innermost `agent_scope`, past call names that ended)."""
    name = _agent.get()
    while isinstance(name, CallAgentName) and name.ended:
        name = name.previous
    return name


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


@contextmanager
def steps_reported_by_driver() -> Iterator[None]:
    """Inside this block, finished episodes do not send `rllm_on_llm_call`: a Ray worker runs its episodes
    here, because the driver it returns them to sends the event, and each Step must be sent exactly once."""
    token = _in_driver.set(False)
    try:
        yield
    finally:
        _in_driver.reset(token)


def report_llm_calls(steps: Iterable[Step]) -> None:
    """Send `rllm_on_llm_call` for each of a finished episode's steps, unless this is a Ray worker (see
    `steps_reported_by_driver`). Called where a Step reaches the driver: `Rollout.arun` for local runs,
    the Ray run's driver loop for the episodes workers send back."""
    if not _in_driver.get():
        return
    from rllm_core.plugins import get_plugin_manager  # late: plugins import adapters lazily

    pm = get_plugin_manager()  # looked up each time: tests and notebooks may reset it
    for step in steps:
        pm.emit("rllm_on_llm_call", step=step)
