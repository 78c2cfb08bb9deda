"""LLM calls that capture saw but could not record: warned about once per (host, path) and counted.

A call capture does not parse goes upstream untouched, so an episode would silently have fewer Steps than
the agent made calls (or none). Instead, transports call `check_unrecorded(host, path, session=...)` for
every POST they pass through; when the path looks like an LLM generation it logs a warning (once per host
and path) and counts it, process-wide and for the episode's session, which the rollout copies into
`episode.metrics["capture/unrecorded_calls"]`.

The rule (`unrecognized_llm_call`): a POST is an LLM generation capture does not understand when its path is
one of the generation APIs below; anything else (embeddings, moderations, tokenize, files, audio, images,
rerank, score, ...) is not a generation and passes silently.

    .../responses/<anything>              a Responses API sub-resource (only POST .../responses is recorded)
    .../generate, .../generate_stream     vLLM / SGLang / TGI native generation
    .../api/chat, .../api/generate        Ollama native
    ...:generateContent, ...:streamGenerateContent           Gemini
    .../converse, .../converse-stream, .../invoke, .../invoke-with-response-stream   Bedrock
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

__all__ = ["METRIC", "check_unrecorded", "note_unrecorded", "reset_unrecorded", "take_unrecorded",
           "unrecognized_llm_call", "unrecorded_counts"]

log = logging.getLogger("rllm.capture")

METRIC = "capture/unrecorded_calls"
"""The episode metric the rollout fills from `take_unrecorded(session)`."""

_GENERATION_TAILS: dict[str, str] = {
    "generate": "a native /generate endpoint is not captured; call /v1/completions or /v1/chat/completions",
    "generate_stream": "a native /generate_stream endpoint is not captured; call /v1/chat/completions",
    "converse": "the Bedrock Converse API is not captured; use an OpenAI-compatible endpoint",
    "converse-stream": "the Bedrock Converse API is not captured; use an OpenAI-compatible endpoint",
    "invoke": "a Bedrock invoke call is not captured; use an OpenAI-compatible endpoint",
    "invoke-with-response-stream": "a Bedrock invoke call is not captured; use an OpenAI-compatible endpoint",
}
_OLLAMA = {"/api/chat", "/api/generate"}

_lock = threading.Lock()
_totals: Counter[str] = Counter()
_by_session: dict[str, Counter[str]] = {}
_warned: set[tuple[str, str]] = set()
_MAX_KEPT = 10_000
"""Sessions counted and (host, path) pairs warned about, at most: a process capturing outside rollouts for days
(nobody takes those sessions) stays bounded; past it the oldest session's count goes, and warnings start over."""


def unrecognized_llm_call(path: str) -> str | None:
    """Why a POST to `path` is an LLM generation capture cannot record, or None when it is not one."""
    path = "/" + path.split("?", 1)[0].strip("/")
    if ":generateContent" in path or ":streamGenerateContent" in path:
        return "the Gemini generateContent API is not captured; use Gemini's OpenAI-compatible endpoint"
    if "/responses/" in path:
        return ("a Responses API sub-resource is not a generation capture records (only POST .../responses "
                "is); its output is not in the episode")
    if any(path.endswith(p) for p in _OLLAMA):
        return "Ollama's native API is not captured; use its OpenAI-compatible /v1 endpoint"
    return _GENERATION_TAILS.get(path.rsplit("/", 1)[-1])


def note_unrecorded(path: str, reason: str, *, host: str = "", session: str | None = None) -> None:
    """Count one unrecorded LLM call (and its episode's session), warning once per (host, path)."""
    key = "/" + path.split("?", 1)[0].strip("/")
    with _lock:
        _totals[key] += 1
        if session is not None:
            if session not in _by_session and len(_by_session) >= _MAX_KEPT:
                del _by_session[next(iter(_by_session))]
            _by_session.setdefault(session, Counter())[key] += 1
        if len(_warned) >= _MAX_KEPT:
            _warned.clear()
        first = (host, key) not in _warned
        _warned.add((host, key))
    if first:
        log.warning("rllm capture did not record POST %s%s: %s. Calls like it are counted in "
                    "episode.metrics[%r].", host, key, reason, METRIC)


def check_unrecorded(host: str, path: str, *, session: str | None = None) -> bool:
    """Note the call when `unrecognized_llm_call(path)` says it is one; True when it was noted."""
    reason = unrecognized_llm_call(path)
    if reason is None:
        return False
    note_unrecorded(path, reason, host=host, session=session)
    return True


def unrecorded_counts(session: str | None = None) -> dict[str, int]:
    """Unrecorded calls by path: this process's total, or one session's (what `take_unrecorded` would give)."""
    with _lock:
        counts = _totals if session is None else _by_session.get(session, Counter())
        return dict(counts)


def take_unrecorded(session: str) -> int:
    """How many calls of `session` went unrecorded, forgetting them (the rollout calls this once per episode)."""
    with _lock:
        return sum(_by_session.pop(session, Counter()).values())


def reset_unrecorded() -> None:
    """Forget every count and warning (tests; a long-lived process starting over)."""
    with _lock:
        _totals.clear()
        _by_session.clear()
        _warned.clear()
