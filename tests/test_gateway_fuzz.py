"""Fuzzing the gateway's HTTP surface: Schemathesis against its OpenAPI document (rllm_rollout/gateway/openapi.py),
and Hypothesis throwing arbitrary bytes at the LLM routes, both at a live gateway with the fake upstream behind.

The contract: no 5xx but an honest upstream 502/504 (the fake upstream answers what it cannot serve with a 400,
as vLLM does, so any other 5xx is the gateway's own), and every 4xx an OpenAI-style JSON error. A malformed
body is a 400 with a message saying what to send, never a 500. Each run is bounded (max_examples, no deadline
per example) and well under a minute.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from rllm_rollout.gateway import GatewayHandle, UpstreamConfig, start_gateway
from rllm_rollout.gateway.openapi import OPENAPI
from rllm_testing.faulty_upstream import start_faulty_upstream

SCHEMA = schemathesis.openapi.from_dict(OPENAPI)
SEEN: Counter[str] = Counter()
"""Responses seen per status class and operation, printed at the end (run with -s to see them)."""


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayHandle]:
    with start_faulty_upstream(fault_rate=0.0) as up, \
            start_gateway(UpstreamConfig(url=up.base_url, timeout_s=5.0), max_body_bytes=1 << 20) as gw:
        yield gw
    print(f"\nfuzz cases by status: {dict(sorted(SEEN.items()))} (total {sum(SEEN.values())})")


def contract_problem(status: int, content_type: str, body: bytes) -> str | None:
    """Why a response breaks the gateway's error contract, or None."""
    if status < 400:
        return None
    if status >= 500 and status not in (502, 504):
        return f"HTTP {status} from the gateway itself: {body[:300]!r}"
    if "application/json" not in content_type:
        return f"HTTP {status} with {content_type!r}, not a JSON error: {body[:300]!r}"
    try:
        err = json.loads(body)["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"HTTP {status} body is not an OpenAI-style error: {body[:300]!r}"
    if status >= 500 and not err["type"].startswith("upstream"):
        return f"HTTP {status} is not an upstream report: {err}"
    return None


@schemathesis.check
def gateway_error_contract(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> bool | None:
    problem = contract_problem(response.status_code, response.headers.get("content-type", [""])[0],
                               response.content)
    if problem is not None:
        raise AssertionError(problem)
    return None


@SCHEMA.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          database=None)
def test_gateway_matches_its_openapi_contract(case: schemathesis.Case, gateway: GatewayHandle) -> None:
    # the gateway forwards fields it does not know (the upstream judges them) and a taken session refuses
    # calls (410): neither "rejects every schema violation" nor "accepts every valid call" is its contract
    if "session_id" in (case.path_parameters or {}):  # takes and deletes never close the sessions calls use
        closes = case.method in ("POST", "DELETE") and "/v1/" not in case.path
        sid = str(case.path_parameters["session_id"])
        case.path_parameters["session_id"] = ("closed-" if closes else "open-") + sid
    response = case.call(base_url=gateway.url, headers={"Authorization": f"Bearer {gateway.client_api_key}"},
                         timeout=10)
    SEEN[f"{response.status_code // 100}xx"] += 1
    case.validate_response(response, excluded_checks=[not_a_server_error, negative_data_rejection,
                                                      positive_data_acceptance],
                           additional_checks=[gateway_error_contract])


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                                 st.dictionaries(st.text(max_size=8), kids,
                                                                                 max_size=4)), max_leaves=12)
FIELDS = ["messages", "prompt", "input", "stream", "n", "model", "tools", "logprobs", "max_tokens", "user",
          "instructions", "include", "stream_options", "return_token_ids"]
BODIES = st.one_of(
    st.binary(max_size=200),  # not JSON, not UTF-8, empty
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),  # JSON, usually not an object
    st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6).map(lambda d: json.dumps(d).encode()),
    st.sampled_from([b"[" * 5000 + b"]" * 5000, b'{"messages": NaN}', b"\xef\xbb\xbf{}", b'{"a":1}garbage',
                     b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}']),
)


@given(route=st.sampled_from(["chat/completions", "completions", "responses"]), body=BODIES,
       content_type=st.sampled_from(["application/json", "text/plain", None]))
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          database=None)
def test_malformed_bodies_get_a_clear_400_never_a_500(gateway: GatewayHandle, http: httpx.Client, route: str,
                                                      body: bytes, content_type: str | None) -> None:
    headers = {"Authorization": f"Bearer {gateway.client_api_key}"}
    if content_type:
        headers["Content-Type"] = content_type
    try:
        resp = http.post(f"{gateway.session_base_url('fuzz')}/{route}", content=body, headers=headers)
    except httpx.HTTPError as exc:
        pytest.fail(f"{route} {body[:200]!r} ({content_type}): no reply from the gateway: {exc!r}")
    SEEN[f"raw {resp.status_code}"] += 1
    problem = contract_problem(resp.status_code, resp.headers.get("content-type", ""), resp.content)
    assert problem is None, f"{route} {body[:120]!r}: {problem}"
    try:
        is_object = isinstance(json.loads(body), dict)
    except (ValueError, RecursionError):
        is_object = False
    if not is_object:  # the gateway's own check: only a JSON object is a request
        assert resp.status_code == 400, (body[:120], resp.status_code, resp.text[:200])
        assert "JSON" in resp.json()["error"]["message"]


def test_garbage_mid_stream_ends_the_call_within_the_upstream_timeout() -> None:
    """Found by the fuzzer: an upstream that writes a second HTTP response into a chunked stream (what a server
    does when its handler fails mid-reply) left aiohttp's parser failed with no sock_read timeout, and the
    gateway waited on the stream forever: the client hung and the call's Step never came. Now each read is
    bounded by the upstream's timeout: the client's stream ends and an errored Step is recorded."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
        await asyncio.sleep(0.05)  # so the garbage usually lands mid-stream, after the first event went out
        assert request.transport is not None
        request.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}")  # not a chunk
        await asyncio.sleep(30)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    loop = asyncio.new_event_loop()
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def start() -> None:
        box["runner"] = runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        with start_gateway(UpstreamConfig(url=f"http://127.0.0.1:{box['port']}/v1", timeout_s=1.0)) as gw:
            t0 = time.monotonic()
            with httpx.stream("POST", f"{gw.session_base_url('g')}/chat/completions", timeout=15,
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
                              headers={"Authorization": f"Bearer {gw.client_api_key}"}) as resp:
                body = b"".join(resp.iter_raw())
            assert time.monotonic() - t0 < 5, "the gateway did not end the stream"
            # garbage in the same read as the headers is a clean 502 (an honest upstream report); mid-stream,
            # the stream ends after what arrived and the Step says it timed out
            assert (resp.status_code, b'"content":"a"' in body) in ((200, True), (502, False)), body[:300]
            steps = gw.take_steps("g")
        assert len(steps) == 1 and steps[0].error, steps
    finally:
        async def stop() -> None:
            await box["runner"].cleanup()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
