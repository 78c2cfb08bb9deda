"""Gateway security: every gateway has a client token (generated when none is given, the shared in-process
one included), the scheme is matched case-insensitively, only the LLM routes reach the upstream, /health
stays open, and a rollout hands the token to its agent as `config.api_key`."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

import rllm
from rllm_core.errors import ConfigError
from rllm_core.gateway import UpstreamConfig, shared_gateway, start_gateway
from rllm_core.net import free_port
from rllm_core.testing.fake_upstream import FakeUpstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_token_is_generated_and_required(fake_upstream: FakeUpstream) -> None:
    up = [UpstreamConfig(url=fake_upstream.base_url)]
    with start_gateway(up) as gw, start_gateway(up) as other:
        token = gw.client_api_key
        assert token and len(token) >= 24 and token != other.client_api_key
        url = gw.session_base_url("a") + "/chat/completions"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token},
                        {"Authorization": f"Basic {token}"}):
            r = httpx.post(url, json=BODY, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", headers
        for route in ("/sessions/a/steps", "/stats"):
            assert httpx.get(gw.url + route).status_code == 401
        assert httpx.post(f"{gw.url}/sessions/a/take").status_code == 401
        assert httpx.delete(f"{gw.url}/sessions/a").status_code == 401
        assert fake_upstream.requests == []
        for scheme in ("Bearer", "bearer", "BEARER"):  # RFC 7235: the scheme is case-insensitive
            r = httpx.post(url, json=BODY, headers={"Authorization": f"{scheme}  {token}"})
            assert r.status_code == 200, scheme
        health = httpx.get(f"{gw.url}/health")  # open: load balancers and probes carry no token
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert len(gw.take_steps("a")) == 3
    assert len(fake_upstream.authorizations) == 3 and token not in str(fake_upstream.authorizations)  # not sent on


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
            assert "POST /v1/chat/completions, /v1/completions, /v1/responses and GET /v1/models" in err["message"]
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
def token_agent(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    no_key = openai.OpenAI(base_url=config.base_url, api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match=r"config\.api_key"):  # the error says what to send
        no_key.chat.completions.create(model=config.model, messages=BODY["messages"])  # type: ignore[arg-type]
    client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    reply = client.chat.completions.create(model=config.model, messages=BODY["messages"])  # type: ignore[arg-type]
    return f"{config.api_key}|{reply.choices[0].message.content}"


def test_the_shared_gateway_s_token_reaches_the_agent_in_a_real_rollout(fake_upstream: FakeUpstream) -> None:
    ep = token_agent.run({"id": "tok"}, base_url=fake_upstream.base_url, model="m")
    shared = shared_gateway([UpstreamConfig(url=fake_upstream.base_url)])
    token = shared.client_api_key
    assert ep.error is None, ep.error
    assert token and ep.artifacts["answer"] == f"{token}|ok: hi" and len(ep.steps) == 1
    assert ep.steps[0].token_source == "server"
    assert shared.remote().client_api_key == token  # what Ray workers are handed


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
            r = httpx.post(f"{url}/sessions/c/v1/chat/completions", json=BODY,
                           headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200
            assert httpx.post(f"{url}/sessions/c/v1/chat/completions", json=BODY).status_code == 401
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
