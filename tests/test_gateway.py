"""The gateway through the real `openai` SDK against the deterministic fake upstream: every recorded id and
logprob must equal what the upstream sent, exactly; what the client did not ask for never reaches it."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest

from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import get_plugin_manager
from rllm_core.types import Step
from rllm_rollout.gateway import GatewayHandle, UpstreamConfig, start_gateway
from rllm_testing.fake_upstream import FakeUpstream, encode, token_logprob

MSGS = [{"role": "user", "content": "hello there"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add",
                                             "parameters": {"type": "object", "properties": {}}}}]


def expected_prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The fake upstream's prompt ids: the UTF-8 bytes (+3) of the canonical JSON of the messages."""
    return encode(json.dumps(messages, sort_keys=True, separators=(",", ":")))


def assert_server_tokens(step: Step, text: str, messages: list[dict[str, Any]] = MSGS) -> None:
    ids = encode(text)
    assert step.token_source == "server" and step.trainable
    assert step.prompt_token_ids == expected_prompt_ids(messages)
    assert step.completion_token_ids == ids
    assert step.logprobs == [token_logprob(t) for t in ids]


@pytest.fixture
def gateway(fake_upstream: FakeUpstream):
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        yield gw


def client_for(gw: GatewayHandle, sid: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.session_base_url(sid), api_key=gw.client_api_key, max_retries=0, **kw)


def auth(gw: GatewayHandle) -> dict[str, str]:
    """The header every gateway route but /health needs (each gateway has a token, generated if not given)."""
    return {"Authorization": f"Bearer {gw.client_api_key}"}


def test_sync_chat_records_exact_server_ids_and_strips_injected_fields(gateway, fake_upstream):
    client = client_for(gateway, "s1")
    resp = client.chat.completions.create(model="m", messages=MSGS, temperature=0.7, max_tokens=50)
    assert resp.choices[0].message.content == "ok: hello there"
    raw = resp.model_dump()
    assert raw["choices"][0].get("logprobs") is None and "token_ids" not in raw["choices"][0]
    assert "prompt_token_ids" not in raw and raw["policy_version"] == 0
    assert fake_upstream.requests[-1]["logprobs"] is True and fake_upstream.requests[-1]["return_token_ids"]
    [step] = gateway.take_steps("s1")
    assert_server_tokens(step, "ok: hello there")
    assert step.endpoint == "chat" and step.model == "m" and step.messages == MSGS
    assert step.params == {"temperature": 0.7, "max_tokens": 50}
    assert step.finish_reason == "stop" and step.usage["completion_tokens"] == len(encode("ok: hello there"))
    assert step.policy_version == 0 and step.latency_s > 0 and step.metadata["response_id"] == resp.id
    assert step.metadata["upstream"] == fake_upstream.base_url
    assert gateway.take_steps("s1") == []  # taken means freed


def test_fields_the_client_asked_for_reach_it(gateway):
    client = client_for(gateway, "s2")
    resp = client.chat.completions.create(model="m", messages=MSGS, logprobs=True,
                                          extra_body={"return_token_ids": True})
    raw = resp.model_dump()
    ids = encode("ok: hello there")
    assert raw["prompt_token_ids"] == expected_prompt_ids(MSGS)
    assert raw["choices"][0]["token_ids"] == ids
    assert [e.logprob for e in resp.choices[0].logprobs.content] == [token_logprob(t) for t in ids]
    [step] = gateway.take_steps("s2")
    assert_server_tokens(step, "ok: hello there")


async def test_async_streaming_tool_calls_n2_one_step_per_choice(gateway):
    client = openai.AsyncOpenAI(base_url=gateway.session_base_url("s3"), api_key=gateway.client_api_key,
                                max_retries=0)
    stream = await client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, n=2, stream=True,
                                                  stream_options={"include_usage": True})
    args: dict[int, str] = {0: "", 1: ""}
    async for chunk in stream:
        for ch in chunk.choices:
            assert ch.logprobs is None and "token_ids" not in (ch.model_extra or {})
            for tc in ch.delta.tool_calls or []:
                args[ch.index] += tc.function.arguments or ""
    await client.close()
    assert args == {0: '{"x": 1}', 1: '{"x": 1}'}
    steps = gateway.take_steps("s3")
    assert [s.choice_index for s in steps] == [0, 1]
    for step in steps:
        assert_server_tokens(step, '{"x": 1}')
        assert step.tool_calls == [{"id": "call_1", "type": "function",
                                    "function": {"name": "add", "arguments": '{"x": 1}'}}]
        assert step.finish_reason == "tool_calls" and step.text is None
        assert step.params["tools"] == TOOLS and step.params["n"] == 2 and step.usage is not None


def test_sync_streaming_text_passes_through_chunk_by_chunk(gateway):
    client = client_for(gateway, "s4")
    pieces = [c.choices[0].delta.content for c in
              client.chat.completions.create(model="m", messages=MSGS, stream=True) if c.choices]
    assert "".join(p or "" for p in pieces) == "ok: hello there"
    assert len(pieces) > len("ok: hello there")  # one chunk per token, not one buffered blob
    [step] = gateway.take_steps("s4")
    assert_server_tokens(step, "ok: hello there")
    assert step.text == "ok: hello there"


@pytest.mark.parametrize("stream", [False, True])
def test_completions_endpoint(gateway, fake_upstream, stream):
    client = client_for(gateway, "c")
    out = client.completions.create(model="m", prompt="2+2=", max_tokens=64, stream=stream)
    text = "".join(c.choices[0].text for c in out if c.choices) if stream else out.choices[0].text
    assert text == "ok: 2+2="
    assert fake_upstream.requests[-1]["logprobs"] is True
    [step] = gateway.take_steps("c")
    ids = encode("ok: 2+2=")
    assert step.endpoint == "completions" and step.prompt == "2+2=" and step.messages is None
    assert step.prompt_token_ids == encode("2+2=") and step.completion_token_ids == ids
    assert step.logprobs == [token_logprob(t) for t in ids] and step.trainable


def test_agent_and_session_headers_and_session_routes(gateway):
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.client_api_key, max_retries=0,
                           default_headers={"X-RLLM-Session": "hdr", "X-RLLM-Agent": "solver"})
    client.chat.completions.create(model="m", messages=MSGS)
    listed = httpx.get(f"{gateway.url}/sessions/hdr/steps", headers=auth(gateway)).json()
    assert len(listed) == 1 and listed[0]["agent"] == "solver"
    assert Step.model_validate(listed[0]).completion_token_ids == encode("ok: hello there")
    assert httpx.delete(f"{gateway.url}/sessions/hdr", headers=auth(gateway)).json() == {"deleted": 1}
    assert gateway.steps("hdr") == []
    models = client_for(gateway, "x").models.list()
    assert [m.id for m in models.data] == ["fake-model"]


def test_policy_version_is_read_from_the_response(gateway, fake_upstream):
    fake_upstream.policy_version = 7
    client_for(gateway, "pv").chat.completions.create(model="m", messages=MSGS)
    list(client_for(gateway, "pv").chat.completions.create(model="m", messages=MSGS, stream=True))
    assert [s.policy_version for s in gateway.take_steps("pv")] == [7, 7]


def test_gateway_sends_no_plugin_event_for_its_steps(gateway):
    """It may be another process than the driver: rllm_on_llm_call is sent once per Step by the rollout that
    takes the steps (tests/test_plugins.py), never by the gateway that records them."""
    seen: list[Step] = []

    class Listener:
        @hookimpl
        def rllm_on_llm_call(self, step: Step) -> None:
            seen.append(step)

    pm = get_plugin_manager()
    listener = Listener()
    pm.register(listener, name="test-listener")
    try:
        client_for(gateway, "ev").chat.completions.create(model="m", messages=MSGS)
    finally:
        pm.pm.unregister(listener)
    assert seen == [] and len(gateway.steps("ev")) == 1


def test_no_inject_upstream_keeps_text_and_marks_untrainable(fake_upstream):
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url, inject_token_ids=False)]) as gw:
        client_for(gw, "h").chat.completions.create(model="m", messages=MSGS)
        [step] = gw.take_steps("h")
    assert "return_token_ids" not in fake_upstream.requests[-1] and "logprobs" not in fake_upstream.requests[-1]
    assert step.text == "ok: hello there" and step.token_source == "none" and not step.trainable
    assert step.completion_token_ids is None and step.logprobs is None


def test_bearer_token_required_and_upstream_key_never_leaks(fake_upstream, caplog):
    caplog.set_level(logging.DEBUG)
    up = UpstreamConfig(url=fake_upstream.base_url, api_key="sk-upstream-secret")
    assert "sk-upstream-secret" not in repr(up) and "sk-upstream-secret" not in str(up)
    with start_gateway([up], api_key="gw-key") as gw:
        assert "sk-upstream-secret" not in repr(gw)
        r = httpx.post(f"{gw.url}/sessions/a/v1/chat/completions", json={"model": "m", "messages": MSGS})
        assert r.status_code == 401 and "session URL" in r.json()["error"]["message"]  # unsigned: a token needed
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": MSGS})
        assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]  # the default session too
        assert httpx.get(f"{gw.url}/sessions/a/steps").status_code == 401
        assert httpx.post(f"{gw.url}/sessions/a/take").status_code == 401
        client = openai.OpenAI(base_url=gw.session_base_url("a"), api_key="gw-key", max_retries=0)
        client.chat.completions.create(model="m", messages=MSGS)
        with pytest.raises(openai.InternalServerError):  # an upstream error is recorded, and logged nowhere
            client.chat.completions.create(model="m", messages=MSGS, n="two")  # type: ignore[arg-type]
        steps_json = httpx.get(f"{gw.url}/sessions/a/steps", headers={"Authorization": "Bearer gw-key"}).text
    assert len(json.loads(steps_json)) == 2
    # the upstream got its own key, never the gateway's
    assert fake_upstream.authorizations[-2:] == ["Bearer sk-upstream-secret"] * 2
    assert "sk-upstream-secret" not in steps_json and "gw-key" not in steps_json
    assert "sk-upstream-secret" not in caplog.text


def test_binds_loopback_unless_told_and_take_route_frees(gateway):
    assert [addr[0] for addr in gateway.addresses] == ["127.0.0.1"]
    client_for(gateway, "tk").chat.completions.create(model="m", messages=MSGS)
    taken = httpx.post(f"{gateway.url}/sessions/tk/take", headers=auth(gateway)).json()
    assert len(taken) == 1
    assert_server_tokens(Step.model_validate(taken[0]), "ok: hello there")
    assert httpx.post(f"{gateway.url}/sessions/tk/take", headers=auth(gateway)).json() == []
    assert gateway.store.sessions() == []


def test_sessions_stick_to_one_upstream_and_new_ones_spread():
    from rllm_testing.fake_upstream import start_fake_upstream

    with start_fake_upstream() as a, start_fake_upstream() as b, \
            start_gateway([UpstreamConfig(url=a.base_url), UpstreamConfig(url=b.base_url)]) as gw:
        for sid in ("s0", "s1", "s2", "s3"):
            for _ in range(3):
                client_for(gw, sid).chat.completions.create(model="m", messages=MSGS)
        by_session = {sid: {s.metadata["upstream"] for s in gw.take_steps(sid)} for sid in ("s0", "s1", "s2", "s3")}
    assert all(len(ups) == 1 for ups in by_session.values())  # sticky
    assert len(a.requests) == len(b.requests) == 6  # least-loaded spreads new sessions evenly


def test_n2_without_streaming_gives_one_step_per_choice(gateway):
    resp = client_for(gateway, "n2").chat.completions.create(model="m", messages=MSGS, n=2)
    assert [c.index for c in resp.choices] == [0, 1]
    steps = gateway.take_steps("n2")
    assert [s.choice_index for s in steps] == [0, 1]
    for step in steps:
        assert_server_tokens(step, "ok: hello there")


def test_public_surface_is_pinned():
    import rllm_rollout.capture as capture
    import rllm_rollout.gateway as gateway_pkg

    assert sorted(gateway_pkg.__all__) == sorted([
        "AGENT_HEADER", "DEFAULT_SESSION", "SESSION_HEADER", "GatewayClient", "GatewayConfig", "GatewayHandle",
        "RemoteGateway", "SessionStore", "UpstreamConfig", "create_app", "shared_gateway", "start_gateway"])
    assert sorted(capture.__all__) == sorted([
        "CallAssembler", "CallRequest", "endpoint_of", "error_step", "install", "is_installed", "is_loopback",
        "prepare_call", "resolve_tokenizer", "retokenize", "retokenize_step", "uninstall"])
    assert UpstreamConfig(url="http://127.0.0.1:1/v1/").url == "http://127.0.0.1:1/v1"
    assert UpstreamConfig(url="http://127.0.0.1:1/v1").inject
    assert not UpstreamConfig(url="https://api.example.com/v1").inject
    with pytest.raises(ValueError, match="HOST:PORT"):
        UpstreamConfig(url="localhost:8000")


@pytest.mark.slow
def test_through_the_real_policy_server_ids_match_what_it_sent():
    """The contract with engineer B's server (tiny random model): what it returns is what we record."""
    serving = pytest.importorskip("rllm_serve")
    with serving.start_policy_server("tiny-random", threads=1) as srv, \
            start_gateway([UpstreamConfig(url=srv.base_url)]) as gw:
        client = client_for(gw, "real")
        resp = client.chat.completions.create(model=srv.model_name, messages=MSGS, max_tokens=6, temperature=1.0,
                                              logprobs=True, extra_body={"return_token_ids": True})
        plain = client.completions.create(model=srv.model_name, prompt="hello", max_tokens=4)
        chat_step, comp_step = gw.take_steps("real")
    assert chat_step.prompt_token_ids == resp.model_extra["prompt_token_ids"]
    assert chat_step.completion_token_ids == resp.choices[0].model_extra["token_ids"]
    assert chat_step.logprobs == [e.logprob for e in resp.choices[0].logprobs.content]
    assert chat_step.policy_version == srv.policy_version and chat_step.trainable
    assert chat_step.token_policy_versions == [srv.policy_version] * len(chat_step.completion_token_ids or [])
    assert chat_step.token_policy_versions == resp.choices[0].model_extra["token_policy_versions"]
    assert "token_ids" not in (plain.choices[0].model_extra or {}) and comp_step.trainable
    assert "token_policy_versions" not in (plain.choices[0].model_extra or {})
    assert comp_step.token_policy_versions == [srv.policy_version] * len(comp_step.completion_token_ids or [])
    assert len(comp_step.completion_token_ids or []) == len(comp_step.logprobs or []) > 0
