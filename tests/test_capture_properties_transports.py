"""Capture never breaks a call, through the real transports: in-process httpx / httpx2 (MockTransport) and the
gateway (an aiohttp upstream that writes a Hypothesis-chosen chunking), with the openai SDK reading odd
streams, and a Responses stream whose hook fails still recorded before the client sees its final event.
The streams and checks are test_capture_properties_support.py's; the assembler alone is
test_capture_properties.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from test_capture_properties_support import (
    ASKS,
    MSGS,
    ODD,
    SLOW,
    call_for,
    check_client_bytes,
    check_steps,
    cut,
    rendered,
    source,
)

from rllm_core.context import EpisodeContext, episode_scope
from rllm_core.types import Step
from rllm_rollout.capture import CallAssembler, install
from rllm_rollout.capture.responses import ResponsesAssembler
from rllm_rollout.capture.responses_input import input_to_messages
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_testing.fake_upstream import FakeUpstream


@pytest.fixture(autouse=True, scope="module")
def _installed() -> None:
    install()


def _url_body(endpoint: str, asks: tuple[bool, bool]) -> tuple[str, dict[str, Any]]:
    call = call_for(endpoint, *asks)
    return {"chat": "/chat/completions", "completions": "/completions", "responses": "/responses"}[endpoint], call.body


@SLOW
@given(data=st.data(), src=source(), asks=ASKS, lib=st.sampled_from([httpx, httpx2]), sync=st.booleans())
def test_in_process_httpx_and_httpx2(data: st.DataObject, src: Any, asks: tuple[bool, bool], lib: Any, sync: bool):
    endpoint, items, calls = src
    raw, _ = data.draw(rendered(items))
    pieces = data.draw(cut(raw))
    path, body = _url_body(endpoint, asks)
    url, sse = "http://127.0.0.1:9/v1" + path, {"content-type": "text/event-stream"}

    async def content() -> Any:
        for p in pieces:
            yield p

    async def read_async() -> bytes:
        handler = lambda request: lib.Response(200, content=content(), headers=sse)  # noqa: E731
        async with lib.AsyncClient(transport=lib.MockTransport(handler)) as client, \
                client.stream("POST", url, json=body) as r:
            return b"".join([b async for b in r.aiter_bytes()])

    ctx = EpisodeContext(session_id="p")
    with episode_scope(ctx):
        if sync:
            handler = lambda request: lib.Response(200, content=iter(pieces), headers=sse)  # noqa: E731
            with lib.Client(transport=lib.MockTransport(handler)) as client, client.stream("POST", url, json=body) as r:
                got = b"".join(r.iter_bytes())
        else:
            got = asyncio.run(read_async())
    check_client_bytes(raw, got, *asks, endpoint=endpoint)
    check_steps(ctx.recorder.steps(), items, calls, endpoint=endpoint)


class _ChunkedUpstream:
    """An aiohttp upstream on 127.0.0.1 that writes `self.pieces` one write each (what the test chose); with
    `self.hold` set, it then keeps the stream open until that is set (10 s at most), so a test can look at what
    was recorded while the client holds the last event and the stream has not ended."""

    def __init__(self) -> None:
        self.pieces, self.loop, self.url = [], asyncio.new_event_loop(), ""
        self.hold: threading.Event | None = None

    async def serve(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for p in self.pieces:
            await resp.write(p)
            await asyncio.sleep(0)
        deadline = time.monotonic() + 10
        while self.hold is not None and not self.hold.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    def __enter__(self) -> _ChunkedUpstream:
        app = web.Application()
        app.router.add_post("/v1/{tail:.*}", self.serve)
        self.runner = web.AppRunner(app, access_log=None)
        ready = threading.Event()

        async def start() -> None:
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"  # type: ignore[union-attr]
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(start()),
                                                       self.loop.run_forever()), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the chunked upstream did not start"
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def chunked_gateway() -> Iterator[tuple[_ChunkedUpstream, Any]]:
    with _ChunkedUpstream() as up, start_gateway([UpstreamConfig(url=up.url)], api_key="k") as gw:
        yield up, gw


_sessions = iter(range(10**9))


@SLOW
@given(data=st.data(), src=source(), asks=ASKS)
def test_through_the_gateway(chunked_gateway: Any, data: st.DataObject, src: Any, asks: tuple[bool, bool]):
    up, gw = chunked_gateway
    endpoint, items, calls = src
    raw, _ = data.draw(rendered(items))
    up.pieces = data.draw(cut(raw))
    path, body = _url_body(endpoint, asks)
    sid = f"prop-{next(_sessions)}"
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", gw.session_base_url(sid) + path, json=body, headers={"Authorization": "Bearer k"}) as r:
        assert r.status_code == 200
        got = b"".join(r.iter_bytes())
    check_client_bytes(raw, got, *asks, endpoint=endpoint)
    check_steps(gw.steps(sid), items, calls, endpoint=endpoint)




def test_the_openai_sdk_reads_odd_streams_in_process_and_through_the_gateway(chunked_gateway: Any):
    up, gw = chunked_gateway
    up.pieces = [ODD[i:i + 11] for i in range(0, len(ODD), 11)]
    ctx = EpisodeContext(session_id="sdk")
    for base, key in ((up.url, "x"), (gw.session_base_url("sdk-gw"), "k")):
        client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
        with episode_scope(ctx) if key == "x" else contextlib.nullcontext():  # the gateway records its own
            chunks = list(client.chat.completions.create(model="m", messages=MSGS, stream=True))
        assert "".join((c.choices[0].delta and c.choices[0].delta.content) or "" for c in chunks if c.choices) == "hé!"
    [mine], [theirs] = ctx.recorder.steps(), gw.steps("sdk-gw")
    for step in (mine, theirs):
        assert step.text == "hé!" and step.error is None and step.metadata["logprobs_incomplete"]


def test_a_corrupt_compressed_reply_is_passed_on_and_recorded_as_such():
    from rllm_rollout.capture.inprocess import _Recording

    ctx = EpisodeContext(session_id="gz")
    rec = _Recording(CallAssembler(call_for("chat", False, False), sse=False), ctx.recorder, "gzip")
    assert rec.feed(b"\x1f\x8bnot gzip at all") == b"\x1f\x8bnot gzip at all" and rec.finish(None) == b""
    [step] = ctx.recorder.steps()
    assert step.error and "corrupt compressed data" in step.error


# ---------------------------------------------------------------------------------- Responses: a failing hook
def _responses_events(up: FakeUpstream, text: str) -> list[bytes]:
    """A real Responses stream (the fake upstream's, with what capture asks for), one item per event."""
    body = {"model": "fake", "input": text, "stream": True, "include": ["message.output_text.logprobs"],
            "enable_response_messages": True}
    raw = httpx.post(up.base_url + "/responses", json=body, timeout=10).content
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]


@pytest.mark.parametrize("hook, at", [("_absorb_chunk", "response.output_text.delta"),
                                      ("_strip", "response.created"), ("_absorb_chunk", "response.completed")])
@pytest.mark.parametrize("transport", ["gateway", "inprocess"])
def test_a_responses_stream_whose_hook_fails_is_recorded_before_its_final_event(
        chunked_gateway: Any, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, transport: str,
        hook: str, at: str) -> None:
    """The Responses stream has no `[DONE]`: after a hook failure (pass-through) its terminal event must still
    end it, so the Step is recorded before the client, which moves on at `response.completed`, sees that."""
    events = _responses_events(fake_upstream, "hold on")
    original = getattr(ResponsesAssembler, hook)

    def exploding(self: ResponsesAssembler, obj: dict[str, Any]) -> None:
        if obj.get("type") == at:
            raise RuntimeError("boom")
        original(self, obj)

    monkeypatch.setattr(ResponsesAssembler, hook, exploding)
    up, gw = chunked_gateway
    sid, ctx = f"hook-{hook}-{at}", EpisodeContext(session_id="hook")
    if transport == "gateway":
        up.pieces, up.hold = events, threading.Event()  # the stream stays open after its final event
        client = openai.OpenAI(base_url=gw.session_base_url(sid), api_key="k", max_retries=0)
        recorded = lambda: gw.steps(sid)  # noqa: E731
    else:  # the chunk after the final event is only read once the client asks past that event
        chunks = iter([*events, b": the end\n\n"])
        mock = httpx.MockTransport(lambda request: httpx.Response(
            200, content=chunks, headers={"content-type": "text/event-stream"}))
        client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0,
                               http_client=httpx.Client(transport=mock))
        recorded = ctx.recorder.steps
    at_final: list[Step] | None = None
    try:
        with episode_scope(ctx) if transport == "inprocess" else contextlib.nullcontext():  # (not both at once)
            for event in client.responses.create(model="fake", input="hold on", stream=True):
                if event.type == "response.completed":
                    at_final = recorded()
                    if up.hold is not None:
                        up.hold.set()
    finally:
        if up.hold is not None:
            up.hold.set()
        up.hold = None
    assert at_final is not None, "the client never saw response.completed"
    [step] = at_final  # recorded before the client saw the final event, and only once
    assert recorded() == [step]
    assert step.error and step.error.startswith("capture failed (RuntimeError: boom)") and not step.trainable
    assert step.endpoint == "responses" and step.messages == input_to_messages({"input": "hold on"})
    assert "ok: hold on".startswith(step.text or "")
