"""Patch `requests.Session.send`: calls to `*/completions` inside an rllm episode become Steps.

The same rules as rllm's own in-process capture: outside an episode nothing changes; calls to the episode's
gateway are left to the gateway (which records them itself) and only get the agent-name header; any other
OpenAI-compatible call is recorded into the episode, with logprobs and token ids requested from loopback
upstreams (and removed again from what the caller sees when it did not ask for them).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import requests

from rllm_core.context import StepRecorder, current_agent, current_episode
from rllm_core.errors import CaptureError
from rllm_rollout.capture import CallAssembler, endpoint_of, error_step, is_loopback, prepare_call

__all__ = ["install", "is_installed", "uninstall"]

AGENT_HEADER = "X-RLLM-Agent"
_lock = threading.Lock()
_original: Any = None


class _TeeRaw:
    """Wraps a streamed response's raw body: parses the SSE events while the caller reads them."""

    def __init__(self, inner: Any, asm: CallAssembler, recorder: StepRecorder) -> None:
        self._inner, self._asm, self._recorder = inner, asm, recorder
        self._done = False

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        try:
            for chunk in self._inner.stream(amt, decode_content=decode_content):
                out = self._asm.feed(chunk)
                if out:
                    yield out
        except Exception as exc:
            self._finish(f"{type(exc).__name__}: {exc}")
            raise
        tail = self._finish(None)
        if tail:
            yield tail

    def _finish(self, error: str | None) -> bytes:
        if self._done:
            return b""
        self._done = True
        tail, steps = self._asm.finish(error)
        for step in steps:
            self._recorder.record(step)
        return tail

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _send(self: requests.Session, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
    ctx = current_episode()
    url = request.url or ""
    endpoint = endpoint_of(urlsplit(url).path) if ctx is not None and request.method == "POST" else None
    if ctx is None or endpoint is None:
        return _original(self, request, **kwargs)  # type: ignore[no-any-return]
    if ctx.gateway_url and url.startswith(ctx.gateway_url):
        agent = current_agent()
        if agent and AGENT_HEADER not in request.headers:
            request.headers[AGENT_HEADER] = agent
        return _original(self, request, **kwargs)  # type: ignore[no-any-return]
    raw = request.body.encode() if isinstance(request.body, str) else request.body
    if not isinstance(raw, bytes):
        return _original(self, request, **kwargs)  # a streamed upload: not an OpenAI-style call
    upstream = url.split("?", 1)[0].removesuffix("/chat/completions").removesuffix("/completions")
    try:
        call, sent = prepare_call(raw, endpoint, upstream=upstream, inject=is_loopback(url), agent=current_agent())
    except CaptureError:
        return _original(self, request, **kwargs)  # let the server answer the malformed body
    request.body = sent
    request.headers["Content-Length"] = str(len(sent))
    request.headers["Accept-Encoding"] = "identity"  # we parse the raw bytes
    try:
        resp: requests.Response = _original(self, request, **kwargs)
    except Exception as exc:
        ctx.recorder.record(error_step(call, f"{type(exc).__name__}: {exc}"))
        raise
    if resp.status_code >= 400:
        ctx.recorder.record(error_step(call, f"upstream returned HTTP {resp.status_code} {resp.reason}"))
        return resp
    asm = CallAssembler(call, sse="text/event-stream" in resp.headers.get("content-type", ""),
                        tokenizer=ctx.tokenizer)
    if kwargs.get("stream"):
        resp.raw = _TeeRaw(resp.raw, asm, ctx.recorder)
        return resp
    out = asm.feed(resp.content)
    tail, steps = asm.finish(None)
    resp._content = out + tail  # what the caller reads: the body minus the fields we asked for on its behalf
    for step in steps:
        ctx.recorder.record(step)
    return resp


def install() -> None:
    """Patch `requests.Session.send` (every `requests.get/post` goes through it). Idempotent."""
    global _original
    with _lock:
        if _original is None:
            _original = requests.Session.send
            requests.Session.send = functools.wraps(_original)(_send)  # type: ignore[method-assign]


def uninstall() -> None:
    """Restore the original `send`."""
    global _original
    with _lock:
        if _original is not None:
            requests.Session.send = _original  # type: ignore[method-assign]
            _original = None


def is_installed() -> bool:
    return _original is not None
