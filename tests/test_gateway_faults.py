"""Bad input and faults at the gateway: each gets a clear status and message, an errored Step where a call was
attempted, and the gateway keeps serving."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web

from rllm_core.net import free_port
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_testing.fake_upstream import start_fake_upstream

MSGS = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": MSGS}


def auth(gw: Any, **extra: str) -> dict[str, str]:
    """The token header every gateway needs (generated when none is given), plus any extra headers."""
    return {"Authorization": f"Bearer {gw.client_api_key}", **extra}


@contextmanager
def serve_app(app: web.Application) -> Iterator[str]:
    """Serve an aiohttp app on 127.0.0.1:<free port> from a thread; yields its base URL (+/v1)."""
    loop = asyncio.new_event_loop()
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["port"] = runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{box['port']}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def slow_stream_app(chunks: int = 60, gap_s: float = 0.02) -> web.Application:
    """An upstream that streams one token every `gap_s`: slow enough for a client to leave mid-stream."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"id":"slow","prompt_token_ids":[1,2],"choices":[{"index":0,"delta":'
                         b'{"role":"assistant","content":""}}]}\n\n')
        for _ in range(chunks):
            await asyncio.sleep(gap_s)
            await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[100],'
                             b'"logprobs":{"content":[{"token":"a","logprob":-0.5}]}}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
def gateway(fake_upstream):
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)], max_body_bytes=64 * 1024) as gw:
        yield gw


def test_malformed_json_is_a_400_with_a_message(gateway):
    url = gateway.session_base_url("bad") + "/chat/completions"
    r = httpx.post(url, content=b"{not json", headers=auth(gateway, **{"Content-Type": "application/json"}))
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url, json=[1, 2], headers=auth(gateway))
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    assert gateway.steps("bad") == []


def test_body_over_the_limit_is_a_400(gateway):
    url = gateway.session_base_url("big") + "/chat/completions"
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}
    r = httpx.post(url, json=big, headers=auth(gateway))
    assert r.status_code == 400 and "limit" in r.json()["error"]["message"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit still holds while reading
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"y" * 1000
        yield b'"}]}'

    r = httpx.post(url, content=chunked(), headers=auth(gateway))
    assert r.status_code == 400 and "limit" in r.json()["error"]["message"]
    assert httpx.post(url, json=BODY, headers=auth(gateway)).status_code == 200  # still serving


def test_refused_connection_is_a_502_and_an_errored_step():
    with start_gateway([UpstreamConfig(url=f"http://127.0.0.1:{free_port('127.0.0.1')}/v1")]) as gw:
        r = httpx.post(gw.session_base_url("r") + "/chat/completions", json=BODY, headers=auth(gw))
        assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
        [step] = gw.take_steps("r")
    assert step.error and "unreachable" in step.error and step.messages == MSGS and not step.trainable


def test_upstream_timeout_is_a_504_and_an_errored_step():
    with start_fake_upstream(delay_s=1.0) as up, \
            start_gateway([UpstreamConfig(url=up.base_url, timeout_s=0.2)]) as gw:
        r = httpx.post(gw.session_base_url("t") + "/chat/completions", json=BODY, headers=auth(gw))
        assert r.status_code == 504 and "timed out" in r.json()["error"]["message"]
        [step] = gw.take_steps("t")
    assert step.error and "timed out" in step.error


def test_upstream_http_error_passes_through_and_is_recorded(gateway, fake_upstream):
    r = httpx.post(gateway.session_base_url("e") + "/chat/completions", json={**BODY, "n": "two"},
                   headers=auth(gateway))
    assert r.status_code == 500  # the upstream's own answer, passed on
    [step] = gateway.take_steps("e")
    assert step.error and "HTTP 500" in step.error
    sent = len(fake_upstream.requests)
    r = httpx.post(gateway.session_base_url("e2") + "/embeddings", json={"input": "x"}, headers=auth(gateway))
    # not an LLM route: refused by the gateway itself (it used to be proxied as is), never recorded
    assert r.status_code == 404 and "/v1/chat/completions" in r.json()["error"]["message"]
    assert gateway.steps("e2") == [] and len(fake_upstream.requests) == sent


def test_client_disconnect_mid_stream_is_recorded_and_gateway_keeps_serving():
    with serve_app(slow_stream_app()) as slow, start_gateway([UpstreamConfig(url=slow)]) as gw:
        url = gw.session_base_url("d") + "/chat/completions"
        with httpx.stream("POST", url, json={**BODY, "stream": True}, headers=auth(gw)) as r:
            first = next(r.iter_raw())
            assert first.startswith(b"data:")
        deadline = time.time() + 10
        while not gw.steps("d") and time.time() < deadline:
            time.sleep(0.05)
        [step] = gw.take_steps("d")
        assert step.error and "disconnected" in step.error
        assert step.completion_token_ids and set(step.completion_token_ids) == {100}
        assert len(step.logprobs or []) == len(step.completion_token_ids)
        # a full stream afterwards is still served and recorded
        with httpx.stream("POST", gw.session_base_url("d2") + "/chat/completions", json={**BODY, "stream": True},
                          timeout=30,
                          headers=auth(gw)) as r:
            body = r.read()
        assert body.rstrip().endswith(b"[DONE]")
        [ok] = gw.take_steps("d2")
        assert ok.error is None and ok.completion_token_ids == [100] * 60 and ok.prompt_token_ids == [1, 2]


def test_200_concurrent_sessions_none_lost_none_duplicated(gateway):
    async def main() -> None:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200),
                                     headers=auth(gateway)) as client:

            async def one(i: int) -> None:
                sid = f"conc-{i}"
                for turn in range(2):
                    body = {"model": "m", "messages": [{"role": "user", "content": f"{sid} turn {turn}"}],
                            "stream": bool(i % 2)}
                    if i % 3 == 0:  # header routing instead of the prefix
                        r = await client.post(gateway.url + "/v1/chat/completions", json=body,
                                              headers={"X-RLLM-Session": sid})
                    else:
                        r = await client.post(gateway.session_base_url(sid) + "/chat/completions", json=body)
                    assert r.status_code == 200

            await asyncio.gather(*(one(i) for i in range(200)))

    asyncio.run(main())
    for i in range(200):
        steps = gateway.take_steps(f"conc-{i}")
        assert [s.messages[0]["content"] for s in steps] == [f"conc-{i} turn 0", f"conc-{i} turn 1"]
        assert all(s.error is None and s.trainable for s in steps)


@pytest.mark.slow
def test_cli_serves_and_records(fake_upstream):
    port = free_port("127.0.0.1")
    env = {**os.environ, "RLLM_LOG_LEVEL": "ERROR"}
    proc = subprocess.Popen([sys.executable, "-m", "rllm", "gateway", "--upstream", fake_upstream.base_url,
                             "--port", str(port), "--api-key", "k"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert line == f"http://127.0.0.1:{port}", proc.stderr.read() if proc.poll() is not None else line  # type: ignore[union-attr]
        auth = {"Authorization": "Bearer k"}
        r = httpx.post(f"{line}/sessions/cli/v1/chat/completions", json=BODY, headers=auth)
        assert r.status_code == 200
        steps = httpx.get(f"{line}/sessions/cli/steps", headers=auth).json()
        assert len(steps) == 1 and steps[0]["token_source"] == "server"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_cli_rejects_a_bad_upstream_url():
    proc = subprocess.run([sys.executable, "-m", "rllm", "gateway", "--upstream", "not-a-url", "--port", "0"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RLLM_LOG_LEVEL": "ERROR"})
    err = " ".join(proc.stderr.split())  # rich wraps long lines
    assert proc.returncode == 2 and "rllm gateway: upstream url 'not-a-url' must look like http://HOST:PORT/v1" in err
    assert "validation error" not in err and "Traceback" not in err  # one clean line, no pydantic boilerplate


def test_a_port_in_use_is_a_clear_config_error(fake_upstream):
    from rllm_core.errors import ConfigError

    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw, \
            pytest.raises(ConfigError, match="could not listen"):
        start_gateway([UpstreamConfig(url=fake_upstream.base_url)], port=gw.port)


def test_a_port_in_use_leaves_no_unclosed_client_session(fake_upstream, caplog):
    """A failed bind used to leak the upstream aiohttp session: 'Unclosed client session' after the error."""
    import gc
    import logging

    from rllm_core.errors import ConfigError

    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw, caplog.at_level(logging.ERROR):
        with pytest.raises(ConfigError):
            start_gateway([UpstreamConfig(url=fake_upstream.base_url)], port=gw.port)
        gc.collect()
    assert "Unclosed client session" not in caplog.text


def test_an_upstream_without_v1_is_named_at_startup():
    from rllm_rollout.gateway.plugin import upstream_warnings

    assert upstream_warnings(["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"]) == []
    (warning,) = upstream_warnings(["http://127.0.0.1:8000"])
    assert "http://127.0.0.1:8000 does not end in /v1" in warning and "8000/chat/completions" in warning


def test_an_unknown_route_is_an_openai_shaped_404_saying_where_calls_go(fake_upstream):
    """A session URL missing /v1 used to get aiohttp's plain-text '404: Not Found'."""
    import httpx

    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        resp = httpx.post(f"{gw.url}/sessions/s1/chat/completions", json={"model": "m", "messages": []})
        assert resp.status_code == 404
        assert "/sessions/<id>/v1/" in resp.json()["error"]["message"] and gw.steps("s1") == []
        assert httpx.get(f"{gw.url}/health").json()["status"] == "ok"  # the known routes still win


def test_stopping_with_a_call_in_flight_is_quick():
    """An interrupted run stops its gateway at exit while agents are mid-call: that used to wait 15 s and
    then print a TimeoutError traceback from the atexit hook."""
    import threading
    import time

    import httpx

    from rllm_rollout.gateway.server import SHUTDOWN_GRACE_S
    from rllm_testing.fake_upstream import start_fake_upstream

    with start_fake_upstream(delay_s=6) as slow:  # longer than the grace, shorter than its own stop wait
        gw = start_gateway([UpstreamConfig(url=slow.base_url)])
        def client_call() -> None:
            try:
                httpx.post(f"{gw.session_base_url('s')}/chat/completions", json={"model": "m", "messages": []},
                           timeout=60, headers=auth(gw))
            except httpx.HTTPError:
                pass  # cut off by the stop: expected

        call = threading.Thread(target=client_call, daemon=True)
        call.start()
        time.sleep(0.5)
        started = time.monotonic()
        gw.stop()
        assert time.monotonic() - started < SHUTDOWN_GRACE_S + 3 and not gw.running
