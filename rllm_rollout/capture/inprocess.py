"""In-process capture: record LLM calls made through any httpx / httpx2 client inside an episode.

`install()` patches `Client.send` and `AsyncClient.send` of both libraries (openai 3.x sends through httpx2,
LangChain, the anthropic SDK and most others through httpx). A POST to an LLM route (`*/chat/completions`,
`*/completions`, `*/responses`, `*/messages`) made while an episode context is active
(`rllm_core.context.current_episode()`) is recorded into that episode's recorder; everything else goes
through untouched. The response stream is wrapped, not read ahead: chunks are parsed by the assembler for
the route (`assemblers.make_assembler`) as the client reads them, so streaming behaves exactly as before and
nothing is buffered twice. Calls to the episode's own gateway are left to the gateway (it records them
itself); they only get the `X-RLLM-Agent` header so the gateway knows which agent made them.
"""

from __future__ import annotations

import functools
import logging
import threading
import zlib
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

from rllm_core.context import AGENT_HEADER, StepRecorder, current_agent, current_episode
from rllm_core.errors import CaptureError
from rllm_core.types import Step
from rllm_rollout.capture.assemble import CallAssembler, error_step, upstream_error
from rllm_rollout.capture.assemblers import make_assembler
from rllm_rollout.capture.request import CallRequest, endpoint_of, is_loopback, prepare_call
from rllm_rollout.capture.unrecorded import check_unrecorded, note_unrecorded

__all__ = ["install", "is_installed", "uninstall"]

log = logging.getLogger("rllm.capture")

_CLOSED_EARLY = "the client closed the response before it ended"
_lock = threading.Lock()
_originals: dict[tuple[str, str], Any] = {}


class _Recording:
    """Feeds one response's bytes to an assembler and records its Steps exactly once.

    We ask for `accept-encoding: identity`; a server that compresses anyway is read through zlib and its
    bytes reach the client untouched (nothing stripped: rewriting compressed bytes is not worth it).
    `feed` and `finish` never raise (the assembler's never do; a corrupt gzip stream or a failing recorder
    is logged and recorded as an error), so capture can only cost a Step, never the caller's call.
    """

    def __init__(self, asm: CallAssembler, recorder: StepRecorder, encoding: str = "") -> None:
        self.asm = asm
        self.recorder = recorder
        self.recorded = False
        enc = encoding.strip().lower()
        self.rewrite = enc in ("", "identity")
        """True when the bytes are plain, so fields we asked for can be stripped from them."""
        self.decoder = zlib.decompressobj(zlib.MAX_WBITS | 32) if enc in ("gzip", "deflate") else None
        self.unreadable = None if self.rewrite or self.decoder is not None else enc

    def feed(self, chunk: bytes) -> bytes:
        if self.recorded:
            return chunk
        if not self.rewrite:
            self._observe(chunk)
            return chunk
        out = self.asm.feed(chunk)
        if self.asm.done and self.asm.sse:  # record before the client sees [DONE] and moves on
            out += self.finish(None)
        return out

    def _observe(self, chunk: bytes, flush: bool = False) -> None:
        """Parse a decoded copy of compressed bytes; the client gets them as they came."""
        if self.decoder is None:
            return
        try:
            data = self.decoder.flush() if flush else self.decoder.decompress(chunk)
        except zlib.error as exc:
            self.decoder, self.unreadable = None, f"corrupt compressed data ({exc})"
            return
        self.asm.feed(data)
        if self.asm.done and self.asm.sse and not flush:
            self.finish(None)

    def finish(self, error: str | None) -> bytes:
        if self.recorded:
            return b""
        if not self.rewrite:
            self._observe(b"", flush=True)
        self.recorded = True
        if self.unreadable and error is None:
            error = f"cannot read a response with content-encoding {self.unreadable!r}; the call was not parsed"
        try:
            tail, steps = self.asm.finish(error)
        except Exception as exc:  # an assembler that overrides finish() (it should override the hooks)
            log.warning("capture: %s.finish failed", type(self.asm).__name__, exc_info=True)
            tail, steps = b"", [error_step(self.asm.call, f"capture failed ({type(exc).__name__}: {exc})")]
        _record_all(self.recorder, steps)
        return tail if self.rewrite else b""


def _record_all(recorder: StepRecorder, steps: list[Step]) -> None:
    for step in steps:
        try:
            recorder.record(step)
        except Exception:  # a recorder that fails costs this Step, never the caller's call
            log.exception("capture: recording a Step failed; the call itself went through")


class _TeeSyncStream:
    """Mixin over the library's SyncByteStream (httpx checks the type): parse while the client reads."""

    def __init__(self, inner: Any, rec: _Recording) -> None:
        self._inner, self._rec = inner, rec

    @property
    def elapsed(self) -> Any:
        return getattr(self._inner, "elapsed", None)

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                out = self._rec.feed(chunk)
                if out:
                    yield out
        except Exception as exc:
            self._rec.finish(f"{type(exc).__name__}: {exc}")
            raise
        tail = self._rec.finish(None)
        if tail:
            yield tail

    def close(self) -> None:
        self._rec.finish(_CLOSED_EARLY)
        self._inner.close()


class _TeeAsyncStream:
    """Async twin of `_TeeSyncStream`."""

    def __init__(self, inner: Any, rec: _Recording) -> None:
        self._inner, self._rec = inner, rec

    @property
    def elapsed(self) -> Any:
        return getattr(self._inner, "elapsed", None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                out = self._rec.feed(chunk)
                if out:
                    yield out
        except Exception as exc:
            self._rec.finish(f"{type(exc).__name__}: {exc}")
            raise
        tail = self._rec.finish(None)
        if tail:
            yield tail

    async def aclose(self) -> None:
        self._rec.finish(_CLOSED_EARLY)
        await self._inner.aclose()


def _plan(lib: ModuleType, request: Any) -> tuple[Any, CallRequest, StepRecorder, Any] | None:
    """Decide what to do with a request: None = pass it through; else (request to send, call, recorder, tok)."""
    ctx = current_episode()
    if ctx is None or request.method != "POST":
        return None
    url = str(request.url)
    if ctx.gateway_url and url.startswith(ctx.gateway_url):
        agent = current_agent()
        if agent and AGENT_HEADER not in request.headers:
            request.headers[AGENT_HEADER] = agent
        return None  # the gateway records (and counts) these itself
    endpoint = endpoint_of(request.url.path)
    if endpoint is None:
        check_unrecorded(request.url.host, request.url.path, session=ctx.session_id)  # loud, never silent
        return None
    try:
        raw = request.content
    except Exception:  # a streamed request body: not an OpenAI-style call we can parse
        note_unrecorded(request.url.path, "its request body is streamed, so it cannot be parsed",
                        host=request.url.host, session=ctx.session_id)
        return None
    upstream = (url.split("?", 1)[0].removesuffix("/chat/completions").removesuffix("/completions")
                .removesuffix("/responses").removesuffix("/messages"))
    try:
        call, sent = prepare_call(raw, endpoint, upstream=upstream, inject=is_loopback(url), agent=current_agent())
    except CaptureError:
        return None  # let the server answer the malformed body with its own error
    headers = request.headers.copy()
    headers["accept-encoding"] = "identity"  # we parse the raw bytes
    if sent is not raw:
        headers.pop("content-length", None)
    new = lib.Request(request.method, request.url, headers=headers, content=sent, extensions=request.extensions)
    return new, call, ctx.recorder, ctx.tokenizer


def _recording(resp: Any, call: CallRequest, recorder: StepRecorder, tokenizer: Any) -> _Recording:
    sse = "text/event-stream" in resp.headers.get("content-type", "")
    asm = make_assembler(call, sse=sse, tokenizer=tokenizer)
    return _Recording(asm, recorder, resp.headers.get("content-encoding", ""))


def _record_read(resp: Any, call: CallRequest, recorder: StepRecorder, tokenizer: Any) -> None:
    """Record a response whose (decoded) body is already in memory; it reaches the client unchanged."""
    asm = make_assembler(call, sse="text/event-stream" in resp.headers.get("content-type", ""), tokenizer=tokenizer)
    asm.feed(resp.content)
    _record_all(recorder, asm.finish(None)[1])


def _upstream_error(resp: Any) -> str:
    return upstream_error(resp.status_code, resp.reason_phrase)


def _patch(lib: ModuleType) -> None:
    sync_stream = type("RLLMTeeSyncStream", (_TeeSyncStream, lib.SyncByteStream), {})
    async_stream = type("RLLMTeeAsyncStream", (_TeeAsyncStream, lib.AsyncByteStream), {})
    orig_send, orig_asend = lib.Client.send, lib.AsyncClient.send

    @functools.wraps(orig_send)
    def send(self: Any, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        plan = _plan(lib, request)
        if plan is None:
            return orig_send(self, request, stream=stream, **kwargs)
        new, call, recorder, tok = plan
        try:
            resp = orig_send(self, new, stream=True, **kwargs)
        except Exception as exc:
            recorder.record(error_step(call, f"{type(exc).__name__}: {exc}"))
            raise
        if resp.status_code >= 400:
            recorder.record(error_step(call, _upstream_error(resp)))
        elif resp.is_stream_consumed:  # a transport that hands over a body already read (httpx.MockTransport)
            _record_read(resp, call, recorder, tok)
        else:
            resp.stream = sync_stream(resp.stream, _recording(resp, call, recorder, tok))
        if not stream:
            try:
                resp.read()
            except BaseException:
                resp.close()
                raise
        return resp

    @functools.wraps(orig_asend)
    async def asend(self: Any, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        plan = _plan(lib, request)
        if plan is None:
            return await orig_asend(self, request, stream=stream, **kwargs)
        new, call, recorder, tok = plan
        try:
            resp = await orig_asend(self, new, stream=True, **kwargs)
        except Exception as exc:
            recorder.record(error_step(call, f"{type(exc).__name__}: {exc}"))
            raise
        if resp.status_code >= 400:
            recorder.record(error_step(call, _upstream_error(resp)))
        elif resp.is_stream_consumed:  # a transport that hands over a body already read (httpx.MockTransport)
            _record_read(resp, call, recorder, tok)
        else:
            resp.stream = async_stream(resp.stream, _recording(resp, call, recorder, tok))
        if not stream:
            try:
                await resp.aread()
            except BaseException:
                await resp.aclose()
                raise
        return resp

    _originals[(lib.__name__, "Client")] = orig_send
    _originals[(lib.__name__, "AsyncClient")] = orig_asend
    lib.Client.send = send
    lib.AsyncClient.send = asend


def _libraries() -> list[ModuleType]:
    libs = []
    for name in ("httpx", "httpx2"):
        try:
            libs.append(__import__(name))
        except ImportError:
            continue
    return libs


def install() -> None:
    """Patch httpx and httpx2 (whichever are installed). Idempotent and thread-safe."""
    with _lock:
        for lib in _libraries():
            if (lib.__name__, "Client") not in _originals:
                _patch(lib)


def uninstall() -> None:
    """Restore the original `send` methods (tests; a process that wants capture off again)."""
    with _lock:
        for lib in _libraries():
            orig = _originals.pop((lib.__name__, "Client"), None)
            aorig = _originals.pop((lib.__name__, "AsyncClient"), None)
            if orig is not None:
                lib.Client.send = orig
            if aorig is not None:
                lib.AsyncClient.send = aorig


def is_installed() -> bool:
    return bool(_originals)
