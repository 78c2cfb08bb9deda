"""`@rllm.rollout`: turn any agent function into something that produces an Episode.

The function gets `(task, config)`; `config.base_url` is this episode's session URL on an in-process gateway
in front of the real upstream, so every LLM call made through it is recorded with the server's own token
ids. Calls made through any other httpx / httpx2 client in the same process are recorded by in-process
capture. The function may be sync, async, return an awaitable, or be an async generator; its return value
is coerced into the Episode (Episode, Trajectory, dict of artifacts, str answer, or None). An Episode it builds
needs no `task=`: `return rllm.Episode(artifacts={"answer": text})` gets this episode's task, id and attempt.

An exception inside the function never escapes `run` / `arun`: the Episode ends with
`termination_reason="error"` and the traceback text, and keeps the steps recorded before the failure.
"""

from __future__ import annotations

import asyncio
import contextvars
import difflib
import functools
import hashlib
import inspect
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from rllm_core.context import EpisodeContext, episode_scope, report_llm_calls
from rllm_core.errors import ConfigError, RLLMWarning
from rllm_core.types import Episode, Step, Task, Trajectory, rollout_scope

if TYPE_CHECKING:  # the gateway (aiohttp) is imported on first run, not by `import rllm`
    from rllm_rollout.gateway.client import GatewayClient

__all__ = ["Rollout", "RolloutConfig", "RolloutFailedWarning", "as_rollout", "build_episode", "derive_seed",
           "rollout"]


def derive_seed(*parts: object) -> int:
    """A seed in [0, 2**31) that depends only on `parts` (ints, strings): the same parts give the same seed in
    every process and on every run (unlike `hash()`, salted per process), different parts unrelated seeds.
    31 bits, because that is what every OpenAI-compatible server accepts (llama.cpp's seed is a uint32)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % 2**31


class RolloutConfig(BaseModel):
    """What a rollout function is handed: where to send its LLM calls and with which model name."""

    model_config = ConfigDict(extra="allow")

    base_url: str
    """This episode's session URL on the gateway (OpenAI-compatible, ends in /v1)."""
    model: str
    session_id: str
    api_key: str = "EMPTY"
    upstream_url: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Default sampling parameters the engine wants (temperature, max_tokens, ...). Never a `seed`: forwarded to
    every call, one seed would make calls with the same messages sample the same tokens; see `call_seed`."""
    seed: int | None = None
    """This episode's seed, derived from the engine's `sampling["seed"]`, the task id and the attempt (so the n
    attempts at a task differ and a rerun repeats them); None: the run is unseeded and every call samples afresh."""

    @property
    def anthropic_base_url(self) -> str:
        """`base_url` for the Anthropic SDK (and CLI agents' ANTHROPIC_BASE_URL): it appends /v1/messages itself.
        (Through the gateway `base_url` works too: the gateway also answers .../v1/v1/messages.)"""
        return self.base_url.rstrip("/").removesuffix("/v1")

    def call_seed(self, index: int) -> int | None:
        """The `seed` to send with this episode's `index`-th LLM call (0, 1, ...), or None when unseeded.

        Each call gets its own, derived from the episode's seed and the index, so that N calls with the same
        messages (N solvers) still sample N different answers, reproducibly. The default rollouts send it; an
        agent of your own makes its training run bit-reproducible by sending it too."""
        return None if self.seed is None else derive_seed(self.seed, "call", index)


class Rollout:
    """A decorated agent function. Call `run` / `arun` to get an Episode; call it directly to just run it."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"@rllm.rollout needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "rollout")
        functools.update_wrapper(self, fn)

    def __call__(self, task: Task, config: RolloutConfig) -> Any:
        return self.fn(task, config)

    def __repr__(self) -> str:
        return f"<rllm.rollout {self.name}>"

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickle by reference when the decorated name is importable (the module attribute is this object, not
        the function, so plain pickle would refuse), else by value: rollouts travel to worker processes."""
        obj: Any = sys.modules.get(getattr(self.fn, "__module__", None) or "")
        for part in getattr(self.fn, "__qualname__", "").split("."):
            obj = getattr(obj, part, None)
        if obj is self:
            return str(self.fn.__qualname__)
        return (Rollout, (self.fn, self.name))

    def run(self, task: Task | dict[str, Any], **kwargs: Any) -> Episode:
        """Run one episode synchronously (not from inside a running event loop: use `arun` there).

        The agent's exception stays in the Episode, as with `arun`; but `run` is what a person calls by hand,
        so it also warns with the exception's last line: otherwise a failed call shows up only as steps
        whose token ids are None."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            episode = asyncio.run(self.arun(task, **kwargs))
            if episode.error:
                warnings.warn(_failure_summary(self.name, episode), RolloutFailedWarning, stacklevel=2)
            return episode
        raise ConfigError("Rollout.run() was called inside a running event loop; use `await rollout.arun(...)`")

    async def arun(
        self,
        task: Task | dict[str, Any],
        *,
        base_url: str | None = None,
        model: str = "default",
        gateway: GatewayClient | None = None,
        api_key: str | None = None,
        session_id: str | None = None,
        timeout_s: float | None = None,
        attempt: int = 0,
        sampling: dict[str, Any] | None = None,
        inject_token_ids: bool | None = None,
        tokenizer: Any = None,
        seed: int | None = None,
        **extra: Any,
    ) -> Episode:
        """Run one episode: open a gateway session, call the function, collect its steps into an Episode.

        `base_url` is the upstream (e.g. the local policy server) and `api_key` its key; the shared in-process
        gateway is put in front of it. `gateway` is a gateway to use instead (a `GatewayHandle`, or a
        `RemoteGateway` for one in another process). `tokenizer` (a path or a tokenizer object) rebuilds the
        ids of calls whose upstream returned none (`token_source="retokenized"`); extra keyword arguments
        become fields of the function's `config`.

        `sampling["seed"]` seeds the run rather than each request: it is taken out of `config.sampling` and
        the episode's `config.seed` is derived from it, the task id and `attempt` (`seed=` sets it directly).
        The engine hands one sampling dict to every episode, so this is what keeps a group's attempts distinct.
        """
        from rllm_core.plugins import get_plugin_manager
        from rllm_rollout.capture.inprocess import install as install_capture
        from rllm_rollout.capture.unrecorded import METRIC, take_unrecorded

        _check_extra(self.name, extra)
        get_plugin_manager()  # load plugins before the agent runs: capture plugins must see its first call
        task = task if isinstance(task, Task) else Task.model_validate(task)
        if gateway is None:
            gateway = _gateway_for(base_url, api_key, inject_token_ids, tokenizer)
        install_capture()
        sid = session_id or uuid.uuid4().hex
        params = dict(sampling or {})
        run_seed = params.pop("seed", None)
        if seed is None and run_seed is not None:
            seed = derive_seed(run_seed, task.id, attempt)
        config = RolloutConfig(
            base_url=gateway.session_base_url(sid),
            model=model,
            session_id=sid,
            api_key=gateway.client_api_key or "EMPTY",
            upstream_url=base_url,
            sampling=params,
            seed=seed,
            **extra,
        )
        ctx = EpisodeContext(session_id=sid, gateway_url=gateway.url, tokenizer=tokenizer)
        started = time.time()
        result: Any = None
        error: str | None = None
        termination = "completed"
        with episode_scope(ctx), rollout_scope(task, sid, attempt):
            deadline = asyncio.timeout(timeout_s or None)  # tells our timeout from the agent's own TimeoutError
            try:
                async with deadline:
                    result = await _invoke(self.fn, task, config)
            except TimeoutError:
                if deadline.expired():
                    # A sync function's worker thread cannot be killed: calls it makes after this point are not
                    # part of the episode (they are freed with the session below).
                    termination, error = "timeout", f"rollout {self.name} timed out after {timeout_s} s"
                else:  # raised by the agent's code (an HTTP client's timeout, say): its error, like any other
                    termination, error = "error", traceback.format_exc()
            except asyncio.CancelledError:
                termination, error = "cancelled", "rollout cancelled"
                raise
            except Exception:
                termination, error = "error", traceback.format_exc()
            finally:
                taken = await gateway.atake(sid)  # closes the session: later calls of a timed-out agent are refused
                steps = await _retokenized(taken.steps, tokenizer)
                steps += ctx.recorder.steps()
        episode = build_episode(task, result, steps, default_name=self.name, episode_id=sid)
        episode.attempt = attempt
        episode.rollout = self.name
        episode.metrics.setdefault("wall_s", time.time() - started)
        episode.metrics["capture/late_calls"] = float(taken.in_flight)  # still running at the take: steps missing
        episode.metrics[METRIC] = float(take_unrecorded(sid))  # LLM calls capture saw but could not record
        if error is not None:
            episode.termination_reason = termination  # type: ignore[assignment]
            episode.error = error
        elif episode.termination_reason is None:
            episode.termination_reason = "completed"
        get_plugin_manager().emit("rllm_on_episode_end", episode=episode)
        report_llm_calls(episode.steps)  # after episode_end, as in a Ray driver: steps carry adapters' joins
        return episode


class RolloutFailedWarning(RLLMWarning):
    """`Rollout.run` returned an Episode whose agent raised, timed out or was cancelled."""


def _failure_summary(name: str, episode: Episode) -> str:
    """'rollout solve ended with error: NotFoundError: ... (episode.error has the traceback)'."""
    lines = [line for line in (episode.error or "").strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "unknown error"
    where = " (episode.error has the whole traceback)" if len(lines) > 1 else ""
    return f"rollout {name} ended with {episode.termination_reason}: {last}{where}"


def _gateway_for(base_url: str | None, api_key: str | None, inject_token_ids: bool | None,
                 tokenizer: Any) -> GatewayClient:
    """The shared in-process gateway in front of `base_url` (started on first use)."""
    from rllm_rollout.gateway import UpstreamConfig, shared_gateway

    if base_url is None:
        raise ConfigError("rollout.arun needs base_url= (the model endpoint, ending in /v1) or gateway=")
    try:
        upstream = UpstreamConfig(url=base_url, api_key=api_key, inject_token_ids=inject_token_ids,
                                  tokenizer=tokenizer if isinstance(tokenizer, str) else None)
    except ValueError as exc:
        raise ConfigError(f"bad model endpoint base_url={base_url!r}: {_first_error(exc)}") from None
    return shared_gateway([upstream])


_ARUN_KEYWORDS = ("base_url", "model", "gateway", "api_key", "session_id", "timeout_s", "attempt", "sampling",
                  "inject_token_ids", "tokenizer", "seed")
"""`Rollout.arun`'s own keyword arguments (a test pins them to its signature)."""


def _check_extra(name: str, extra: dict[str, Any]) -> None:
    """Refuse extra keyword arguments that look like a misspelt parameter (`timeout=` for `timeout_s=`) or
    that name a config field the rollout sets itself: otherwise they would silently become config fields
    and the setting they meant would not be applied."""
    for key in extra:
        if key in RolloutConfig.model_fields:
            raise ConfigError(f"rollout {name}: {key}= is set by the rollout itself (config.{key}); the keyword "
                              f"arguments of Rollout.run / arun are {', '.join(_ARUN_KEYWORDS)}")
        # Short names are left alone: too many real field names are one letter off one (mode= / model=).
        close = difflib.get_close_matches(key, _ARUN_KEYWORDS, n=1, cutoff=0.75) if len(key) >= 5 else []
        if close:
            raise ConfigError(
                f"rollout {name}: unknown keyword argument {key}= (did you mean {close[0]}=?). Rollout.run / arun "
                f"take {', '.join(_ARUN_KEYWORDS)}; any other keyword becomes a field of the agent's config, but "
                "not one this close to a parameter's name, which is almost always a typo")


async def _retokenized(steps: list[Step], tokenizer: Any) -> list[Step]:
    """`retokenize_step` over an episode's steps, in a worker thread: a big episode's retokenizing would
    otherwise stall every other episode on the event loop."""
    from rllm_rollout.capture.retokenize import retokenize_step

    if tokenizer is None or not steps:
        return steps  # nothing to rebuild: no thread hop
    return await asyncio.to_thread(lambda: [retokenize_step(s, tokenizer) for s in steps])


def _first_error(exc: ValueError) -> str:
    """The message of a pydantic ValidationError without its boilerplate (or the error as is)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return str(first.get("ctx", {}).get("error") or first.get("msg"))
    return str(exc)


async def _invoke(fn: Callable[..., Any], task: Task, config: RolloutConfig) -> Any:
    """Call sync / async / awaitable-returning / async-generator functions alike; return the final value."""
    if inspect.isasyncgenfunction(fn):
        last: Any = None
        async for item in fn(task, config):
            last = item
        return last
    if inspect.iscoroutinefunction(fn):
        return await fn(task, config)
    # Sync: run in a worker thread of our own pool, with a copy of the context (so capture still attributes
    # calls). Not asyncio.to_thread: the loop's default pool has min(32, cpus + 4) threads (6 on 2 cores), which
    # would cap an engine running 16 or 64 blocking agents at once, and starve its graders of threads.
    ctx = contextvars.copy_context()
    out = await asyncio.get_running_loop().run_in_executor(_agent_pool(), ctx.run, fn, task, config)
    if inspect.isawaitable(out):
        return await out
    return out


_AGENT_THREADS = 256
"""Blocking agents that can run at once: they mostly wait on HTTP, so threads are cheap here."""
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _agent_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_AGENT_THREADS, thread_name_prefix="rllm-agent")
        return _pool


def _split_by_agent(steps: list[Step], default_name: str) -> list[Trajectory]:
    by_name: dict[str, Trajectory] = {}
    for step in sorted(steps, key=lambda s: (s.started_at, s.choice_index)):
        name = step.agent or default_name
        by_name.setdefault(name, Trajectory(name=name)).steps.append(step)
    return list(by_name.values())


def build_episode(
    task: Task, result: Any, steps: list[Step], default_name: str = "default", episode_id: str | None = None
) -> Episode:
    """Coerce a rollout's return value plus its captured steps into one Episode.

    - Episode: kept; captured steps fill it only where it has no steps of its own. One built inside the rollout
      without `task` / `id` already has the rollout's (see `rllm_core.types.rollout_scope`).
    - Trajectory: becomes the episode's trajectory (filled with the captured steps if it has none).
    - dict: stored as artifacts; str: stored as artifacts["answer"]; None: nothing.
    Captured steps are split into trajectories by their `agent` name (default: the rollout's name).
    """
    captured = _split_by_agent(steps, default_name)
    if isinstance(result, Episode):
        ep = result
        if not any(t.steps for t in ep.trajectories):
            named = {t.name: t for t in ep.trajectories}
            for traj in captured:
                if traj.name in named:
                    named[traj.name].steps = traj.steps
                else:
                    ep.trajectories.append(traj)
        return ep
    ep = Episode(id=episode_id or uuid.uuid4().hex, task=task)
    if isinstance(result, Trajectory):
        if not result.steps:
            result.steps = [s for t in captured for s in t.steps]
        ep.trajectories = [result]
        return ep
    ep.trajectories = captured
    if isinstance(result, dict):
        ep.artifacts = dict(result)
    elif isinstance(result, str):
        ep.artifacts = {"answer": result}
    elif result is not None:
        ep.artifacts = {"result": repr(result)}
    return ep


def rollout(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator: `@rllm.rollout` or `@rllm.rollout(name="solver")`."""
    if fn is None:
        return lambda f: Rollout(f, name=name)
    return Rollout(fn, name=name)


def as_rollout(obj: Any) -> Rollout:
    """Accept a Rollout, or a plain `(task, config)` function, for engines that take user agents."""
    if isinstance(obj, Rollout):
        return obj
    if callable(obj):
        return Rollout(obj)
    raise ConfigError(f"expected an @rllm.rollout function, got {type(obj).__name__}: {obj!r}")
