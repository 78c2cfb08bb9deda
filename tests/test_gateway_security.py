"""Gateway security: every gateway has a client token (generated when none is given, the shared in-process
one included), the scheme is matched case-insensitively, only the LLM routes reach the upstream, /health
stays open (liveness only), and an agent needs no key: the session URL a rollout hands it is signed."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

import rllm
from rllm_core.errors import ConfigError
from rllm_core.net import free_port
from rllm_rollout.gateway import UpstreamConfig, shared_gateway, start_gateway
from rllm_testing.fake_upstream import FakeUpstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_token_is_generated_and_required(fake_upstream: FakeUpstream) -> None:
    """Every gateway has a token; an unsigned session path, the default session and every route that reads or
    closes sessions need it; the session URL the gateway gives out needs nothing (its signature is the proof)."""
    up = [UpstreamConfig(url=fake_upstream.base_url)]
    with start_gateway(up) as gw, start_gateway(up) as other:
        token = gw.client_api_key
        assert token and len(token) >= 24 and token != other.client_api_key
        plain = f"{gw.url}/sessions/a/v1/chat/completions"
        for url in (plain, f"{gw.url}/v1/chat/completions", other.session_base_url("a") + "/chat/completions"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token},
                            {"Authorization": f"Basic {token}"}):
                r = httpx.post(url.replace(other.url, gw.url), json=BODY, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", headers
        for route in ("/sessions/a/steps", "/stats"):
            assert httpx.get(gw.url + route).status_code == 401
        assert httpx.post(f"{gw.url}/sessions/a/take").status_code == 401
        assert httpx.delete(f"{gw.url}/sessions/a").status_code == 401
        assert fake_upstream.requests == []
        for scheme in ("Bearer", "bearer", "BEARER"):  # RFC 7235: the scheme is case-insensitive
            r = httpx.post(plain, json=BODY, headers={"Authorization": f"{scheme}  {token}"})
            assert r.status_code == 200, scheme
        for headers in ({}, {"Authorization": "Bearer EMPTY"}, {"x-api-key": "sk-agent"}):  # the session URL
            r = httpx.post(gw.session_base_url("a") + "/chat/completions", json=BODY, headers=headers)
            assert r.status_code == 200, headers
        health = httpx.get(f"{gw.url}/health")  # open: load balancers and probes carry no token
        assert health.status_code == 200 and health.json() == {"status": "ok"}  # liveness only, no upstream URL
        assert len(gw.take_steps("a")) == 6
    assert len(fake_upstream.authorizations) == 6 and token not in str(fake_upstream.authorizations)  # not sent on
    assert "EMPTY" not in str(fake_upstream.authorizations)  # nor the agent's own key


@pytest.mark.parametrize(("method", "path", "status"), [
    ("POST", "files", 404), ("GET", "files", 404), ("POST", "fine_tuning/jobs", 404), ("POST", "embeddings", 404),
    ("DELETE", "models/m", 405), ("GET", "chat/completions", 405), ("PUT", "responses", 405),
    ("POST", "foo/chat/completions", 404),
])
def test_only_llm_routes_reach_the_upstream(fake_upstream: FakeUpstream, method: str, path: str,
                                            status: int) -> None:
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url, api_key="sk-up")]) as gw:
        headers = {"Authorization": f"Bearer {gw.client_api_key}"}
        for base in (gw.session_base_url("s"), gw.url + "/v1"):
            r = httpx.request(method, f"{base}/{path}", json={"x": 1}, headers=headers)
            assert r.status_code == status
            err = r.json()["error"]
            allowed = "POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and GET /v1/models"
            assert allowed in err["message"]
            if status == 405:
                assert r.headers["Allow"] in ("GET", "POST")
        assert fake_upstream.requests == [] and gw.steps("s") == []
        models = httpx.get(gw.session_base_url("s") + "/models", headers=headers)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "fake-model"


def test_no_auth_only_on_loopback(fake_upstream: FakeUpstream) -> None:
    up = [UpstreamConfig(url=fake_upstream.base_url)]
    with start_gateway(up, auth=False) as gw:
        assert gw.client_api_key is None
        assert httpx.post(gw.session_base_url("n") + "/chat/completions", json=BODY).status_code == 200
    with pytest.raises(ConfigError, match="needs a client token"):
        start_gateway(up, host="0.0.0.0", auth=False)
    with pytest.raises(ConfigError, match="contradict"):
        start_gateway(up, api_key="k", auth=False)


@rllm.rollout
def key_agent(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    """An agent that sends a placeholder, the token, and then no Authorization at all: all three work."""
    replies = []
    for key in ("EMPTY", config.api_key):
        client = openai.OpenAI(base_url=config.base_url, api_key=key, max_retries=0)
        reply = client.chat.completions.create(model=config.model, messages=BODY["messages"])  # type: ignore
        replies.append(reply.choices[0].message.content)
    raw = httpx.post(config.base_url + "/chat/completions", json={**BODY, "model": config.model})
    return "|".join([*replies, raw.json()["choices"][0]["message"]["content"]])


def test_any_key_the_agent_sends_works_in_a_real_rollout(fake_upstream: FakeUpstream) -> None:
    ep = key_agent.run({"id": "tok"}, base_url=fake_upstream.base_url, model="m")
    shared = shared_gateway([UpstreamConfig(url=fake_upstream.base_url)])
    token = shared.client_api_key
    assert ep.error is None, ep.error
    assert token and ep.artifacts["answer"] == "ok: hi|ok: hi|ok: hi" and len(ep.steps) == 3
    assert all(s.token_source == "server" for s in ep.steps)
    assert shared.remote().client_api_key == token  # what Ray workers are handed
    assert shared.remote().session_base_url("x") == shared.session_base_url("x")  # they mint the same URLs


@pytest.mark.slow
def test_cli_generates_and_prints_a_token_or_takes_it_from_the_environment(fake_upstream: FakeUpstream) -> None:
    for env_key in (None, "from-env"):
        port = free_port("127.0.0.1")
        env = {**os.environ, "RLLM_LOG_LEVEL": "ERROR"}
        env.pop("RLLM_GATEWAY_API_KEY", None)
        if env_key:
            env["RLLM_GATEWAY_API_KEY"] = env_key
        proc = subprocess.Popen([sys.executable, "-m", "rllm", "gateway", "--upstream", fake_upstream.base_url,
                                 "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                text=True)
        try:
            url = proc.stdout.readline().strip()  # type: ignore[union-attr]
            token = proc.stdout.readline().strip()  # type: ignore[union-attr]
            assert url == f"http://127.0.0.1:{port}" and token == (env_key or token) and len(token) >= 8
            ready = proc.stdout.readline().strip()  # type: ignore[union-attr]  # a session URL, any key works
            r = httpx.post(f"{url}/sessions/c/v1/chat/completions", json=BODY,
                           headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200
            assert httpx.post(f"{url}/sessions/c/v1/chat/completions", json=BODY).status_code == 401
            assert ready.startswith(f"{url}/sessions/session-") and ready.endswith("/v1")
            client = openai.OpenAI(base_url=ready, api_key="EMPTY", max_retries=0)  # the vLLM way: a placeholder
            assert client.chat.completions.create(model="m", messages=BODY["messages"]).choices  # type: ignore
        finally:
            proc.terminate()
            proc.wait(10)
    bad = subprocess.run([sys.executable, "-m", "rllm", "gateway", "--upstream", fake_upstream.base_url,
                          "--host", "0.0.0.0", "--port", "0", "--no-auth"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "RLLM_LOG_LEVEL": "ERROR"})
    assert bad.returncode == 2 and "needs a client token" in " ".join(bad.stderr.split())


@pytest.mark.parametrize("path", ["models/..%2ffiles", "models/..%2Ffiles/file-1/content", "models/%2e%2e/files",
                                  "models/x%2f..%2f..%2ffine_tuning/jobs", "models/%2e/x", "models//files"])
def test_dot_segments_never_walk_out_of_the_allowed_routes(fake_upstream: FakeUpstream, path: str) -> None:
    """GET models/<id> passes upstream; an encoded `..` must not turn it into /v1/files with the upstream's key."""
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        n_before = len(fake_upstream.requests)
        r = httpx.get(f"{gw.url}/v1/{path}", headers={"Authorization": f"Bearer {gw.client_api_key}"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    assert len(fake_upstream.requests) == n_before


def test_half_open_connections_are_closed_after_the_header_deadline(fake_upstream: FakeUpstream,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients that connect and send nothing, or trickle a header, are dropped after HEADER_TIMEOUT_S (here
    0.5 s); a request that completes its headers in time is served, and /health stays liveness only."""
    import socket
    import time

    from rllm_rollout.gateway import header_deadline

    monkeypatch.setattr(header_deadline, "HEADER_TIMEOUT_S", 0.5)
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        host, port = gw.host, gw.port
        idle = [socket.create_connection((host, port), timeout=5) for _ in range(50)]
        trickle = socket.create_connection((host, port), timeout=5)
        trickle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for s in [*idle, trickle]:
            assert s.recv(1) == b""  # closed by the gateway, not by our timeout (which would raise)
            s.close()
        assert time.monotonic() - started < 3
        slow = socket.create_connection((host, port), timeout=5)
        slow.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.2)
        slow.sendall(b"Host: x\r\nConnection: close\r\n\r\n")
        reply = slow.recv(4096)
        slow.close()
        assert reply.startswith(b"HTTP/1.1 200"), reply
        assert httpx.get(f"http://{host}:{port}/health").json() == {"status": "ok"}
