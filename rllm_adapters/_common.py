"""What every framework adapter shares: import and version checks, attribution scopes, ad-hoc episodes, the
call log that joins framework-level call records with the wire-level Steps.

Why a join: token ids and logprobs only exist on the wire (framework callback objects drop `token_ids`), while
run ids, parent run ids and graph node names only exist inside the framework. Each adapter adds one
`CallRecord` per model call (keyed by the episode's session id); when the episode ends, `CallLog.join` puts
the framework's structure into the matching Step's `metadata`. Matching is by a prompt fingerprint (message
count, roles, last message text) and agent name, in call order, so it works whether the Step was recorded by
the gateway (another thread, no context) or by in-process capture.

Agent attribution itself does not wait for the join: adapters set `rllm_core.context.agent_scope` around
each model call, which in-process capture reads directly and turns into the `X-RLLM-Agent` header for
calls that go through the gateway, so `Step.agent` (and with it the trajectory split) is right on the wire.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field

from rllm_core.context import EpisodeContext, agent_scope, current_episode, episode_scope, report_llm_calls
from rllm_core.errors import RLLMWarning
from rllm_core.types import Episode, Step, Task
from rllm_rollout.rollout import build_episode

__all__ = [
    "AdapterWarning",
    "CallLog",
    "CallRecord",
    "Restore",
    "call_log",
    "check_version",
    "enter_scopes",
    "fingerprint",
    "finish_adhoc_episode",
    "lazy_exports",
    "message_text",
    "open_adhoc_episode",
    "require_framework",
    "reset_warnings",
    "warn_once",
]


log = logging.getLogger("rllm.adapters")


class AdapterWarning(RLLMWarning):
    """An adapter works but something is off: untested framework version, call outside @rllm.rollout."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str, stacklevel: int = 3) -> None:
    """Warn once per process per `key`: a warning repeated for every LLM call would drown the user's output."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, AdapterWarning, stacklevel=stacklevel)


def reset_warnings() -> None:
    """Let every once-only warning fire again (tests; a long-lived process that wants to be told again)."""
    with _warned_lock:
        _warned.clear()


def require_framework(module: str, *, extra: str | None, adapter: str, dist: str | None = None) -> ModuleType:
    """Import the framework an adapter needs, or fail with an ImportError naming the rllm extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        how = f'pip install "rllm[{extra}]"' if extra else f"pip install {dist or module}"
        raise ImportError(
            f"rllm_adapters.{adapter} needs the {module!r} package, which is not installed "
            f"({exc}). Install it with: {how}"
        ) from exc


def check_version(dist: str, tested: str, *, adapter: str) -> bool:
    """Warn (once) when the installed `dist` is outside the version range the adapter was tested with.

    Returns True when the version is inside the range (or cannot be read: nothing useful to say then).
    """
    try:
        installed = Version(version(dist))
    except (PackageNotFoundError, InvalidVersion):
        return True
    if installed in SpecifierSet(tested):
        return True
    warn_once(
        f"version:{dist}",
        f"{dist} {installed} is outside the range rllm_adapters.{adapter} was tested with ({dist}{tested}); "
        f"capture may miss names or calls. Install a tested version: pip install \"{dist}{tested}\"",
    )
    return False


def lazy_exports(
    exports: dict[str, str], *, framework: str, dist: str, tested: str, extra: str | None, adapter: str
) -> Callable[[str], Any]:
    """A module `__getattr__` that imports an adapter's framework on first use of one of its names.

    Adapter packages stay importable without their framework, so their `plugin` submodule (loaded by the
    plugin manager for every installed adapter) never fails; `from rllm_adapters.x import Name` still
    raises an ImportError naming the extra to install.
    """
    version_checked = threading.Event()

    def __getattr__(name: str) -> Any:
        # Python calls a module's __getattr__ on every access of a name the module lacks. The imports below
        # are sys.modules lookups after the first time; the version check reads package metadata from
        # disk, so it runs once per adapter.
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module 'rllm_adapters.{adapter}' has no attribute {name!r}")
        require_framework(framework, extra=extra, adapter=adapter, dist=dist)
        if not version_checked.is_set():
            version_checked.set()
            check_version(dist, tested, adapter=adapter)
        return getattr(importlib.import_module(module), name)

    return __getattr__


# --------------------------------------------------------------------------------------------- scopes
Restore = Callable[[], None]


def _enter(cm: AbstractContextManager[Any]) -> Restore:
    cm.__enter__()

    def restore() -> None:
        try:
            cm.__exit__(None, None, None)
        except (ValueError, RuntimeError):
            # The framework ended the call in another context than it started it (a callback run in an
            # executor), or twice: the variable there was never set by us, so there is nothing to undo.
            pass

    return restore


def enter_scopes(agent: str | None = None, episode: EpisodeContext | None = None) -> Restore:
    """Set the agent name and/or episode for the calls that follow in this context; return the undo.

    For callbacks that come in start/end pairs (LangChain's on_chat_model_start / on_llm_end, tracing span
    start / end) where a `with` block cannot span both.
    """
    undo: list[Restore] = []
    if episode is not None and current_episode() is not episode:
        undo.append(_enter(episode_scope(episode)))
    if agent is not None:
        undo.append(_enter(agent_scope(agent)))

    def restore() -> None:
        for fn in reversed(undo):
            fn()

    return restore


# -------------------------------------------------------------------------------------- ad-hoc episodes
def open_adhoc_episode(adapter: str) -> EpisodeContext:
    """An episode for calls made outside @rllm.rollout, so they are still recorded; warns once per adapter."""
    from rllm_rollout.capture.inprocess import install as install_capture

    install_capture()
    try:
        warn_once(
            f"adhoc:{adapter}",
            f"rllm_adapters.{adapter}: an LLM call was made outside an @rllm.rollout function; it is recorded "
            "under an ad-hoc episode (EpisodeContext(adhoc=True)). Run the agent inside @rllm.rollout to get "
            "Episodes with tasks and rewards.",
            stacklevel=4,
        )
    except Warning as exc:  # warnings turned into errors (-W error): still never raise inside the user's agent
        log.warning("%s", exc)
    return EpisodeContext(session_id=f"adhoc-{uuid.uuid4().hex}", adhoc=True)


def finish_adhoc_episode(ctx: EpisodeContext, name: str, error: str | None = None) -> Episode:
    """Turn an ad-hoc session into an Episode: its captured steps, joined with the adapter's call records."""
    episode = build_episode(Task(id=ctx.session_id), None, ctx.recorder.steps(), default_name=name,
                            episode_id=ctx.session_id)
    join_records(episode.steps, call_log.pop(ctx.session_id))
    episode.termination_reason = "error" if error else "completed"
    episode.error = error
    episode.rollout = name
    report_llm_calls(episode.steps)  # the Steps reach their driver here, as at the end of Rollout.arun
    return episode


# ------------------------------------------------------------------------------------------- call log
def message_text(content: Any) -> str:
    """The text of an OpenAI-style message content (a string, or a list of typed parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or ""))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


Fingerprint = tuple[int, tuple[str, ...], str]


def fingerprint(messages: Iterable[dict[str, Any]] | None) -> Fingerprint | None:
    """A prompt's identity as both sides can see it: message count, roles, and the last message's text."""
    if messages is None:
        return None
    msgs = list(messages)
    if not msgs:
        return (0, (), "")
    roles = tuple(str(m.get("role", "")) for m in msgs)
    return (len(msgs), roles, message_text(msgs[-1].get("content")).strip()[:500])


class CallRecord(BaseModel):
    """One model call as the framework saw it: who made it and where it sits in the framework's run tree."""

    framework: str
    agent: str | None = None
    fingerprint: Fingerprint | None = None
    started_at: float = Field(default_factory=time.time)
    response_id: str | None = None
    """The server's response id when the framework kept it: an exact join key (else the fingerprint is used)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """run_id, parent_run_id, node, span ids... copied into the joined Step's metadata."""
    step_id: str | None = None
    """Set by the join: the Step this call matched."""


class CallLog:
    """Framework call records per episode session, joined into that episode's Steps when it ends.

    Bounded: sessions that never end (a crashed worker) are dropped oldest-first beyond `max_sessions`.
    """

    def __init__(self, max_sessions: int = 4096) -> None:
        self._lock = threading.Lock()
        self._by_session: OrderedDict[str, list[CallRecord]] = OrderedDict()
        self.max_sessions = max_sessions

    def add(self, session_id: str, record: CallRecord) -> None:
        with self._lock:
            records = self._by_session.get(session_id)
            if records is None:
                records = self._by_session[session_id] = []
                while len(self._by_session) > self.max_sessions:
                    self._by_session.popitem(last=False)
            records.append(record)

    def records(self, session_id: str) -> list[CallRecord]:
        with self._lock:
            return list(self._by_session.get(session_id, []))

    def pop(self, session_id: str, framework: str | None = None) -> list[CallRecord]:
        """Take the records of one session (only those of `framework` when given)."""
        with self._lock:
            records = self._by_session.get(session_id, [])
            taken = [r for r in records if framework is None or r.framework == framework]
            kept = [r for r in records if not (framework is None or r.framework == framework)]
            if kept:
                self._by_session[session_id] = kept
            else:
                self._by_session.pop(session_id, None)
            return taken

    def join(self, episode: Episode, framework: str | None = None) -> int:
        """Annotate the episode's Steps with their framework records; returns how many Steps matched."""
        records = self.pop(episode.id, framework)
        return join_records(episode.steps, records)


def join_records(steps: list[Step], records: list[CallRecord]) -> int:
    """Match records to steps: first by response id, then in call order by fingerprint and agent name."""
    pending = sorted(records, key=lambda r: r.started_at)
    open_steps = [s for s in steps if "framework" not in s.metadata]
    by_response = {s.metadata.get("response_id"): s for s in open_steps if s.metadata.get("response_id")}
    matched = 0
    for rec in list(pending):
        step = by_response.pop(rec.response_id, None) if rec.response_id else None
        if step is not None:
            _annotate(step, rec)
            pending.remove(rec)
            open_steps.remove(step)
            matched += 1
    for step in open_steps:
        fp = fingerprint(step.messages)
        for i, rec in enumerate(pending):
            if rec.agent is not None and step.agent is not None and rec.agent != step.agent:
                continue
            if rec.fingerprint is not None and fp is not None and rec.fingerprint != fp:
                continue
            _annotate(step, rec)
            del pending[i]
            matched += 1
            break
    return matched


def _annotate(step: Step, rec: CallRecord) -> None:
    step.metadata.update({"framework": rec.framework, **rec.metadata})
    rec.step_id = step.id


call_log = CallLog()
"""The process-wide call log all adapters write to."""
