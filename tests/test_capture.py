"""In-process capture through the real `openai` SDK (httpx2) and plain httpx against the fake upstream, and
the shared assembler on its own: ids and logprobs recorded must equal what the upstream sent, exactly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from rllm_core.context import EpisodeContext, agent_scope, episode_scope
from rllm_core.types import Step
from rllm_rollout.capture import CallAssembler, install, prepare_call
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_testing.fake_upstream import encode, token_logprob

MSGS = [{"role": "user", "content": "hello there"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


def prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    return encode(json.dumps(messages, sort_keys=True, separators=(",", ":")))


def assert_exact(step: Step, text: str) -> None:
    ids = encode(text)
    assert step.token_source == "server" and step.trainable and step.error is None
    assert step.prompt_token_ids == prompt_ids(MSGS)
    assert step.completion_token_ids == ids and step.logprobs == [token_logprob(t) for t in ids]


@pytest.fixture(autouse=True)
def _capture_installed() -> None:
    install()


@pytest.fixture
def ctx() -> EpisodeContext:
    return EpisodeContext(session_id="ep")


def test_sync_openai_call_is_recorded_and_injected_fields_stripped(fake_upstream, ctx):
    client = openai.OpenAI(base_url=fake_upstream.base_url, api_key="x", max_retries=0)
    with episode_scope(ctx), agent_scope("planner"):
        resp = client.chat.completions.create(model="m", messages=MSGS, temperature=0.5)
    assert resp.choices[0].message.content == "ok: hello there"
    assert resp.choices[0].logprobs is None and "prompt_token_ids" not in (resp.model_extra or {})
    assert fake_upstream.requests[-1]["return_token_ids"] is True
    [step] = ctx.recorder.steps()
    assert_exact(step, "ok: hello there")
    assert step.agent == "planner" and step.params == {"temperature": 0.5} and step.messages == MSGS
    assert step.metadata["upstream"] == fake_upstream.base_url


async def test_async_streaming_tool_call_is_recorded_while_the_client_reads(fake_upstream, ctx):
    client = openai.AsyncOpenAI(base_url=fake_upstream.base_url, api_key="x", max_retries=0)
    with episode_scope(ctx):
        stream = await client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, stream=True)
        names = [tc.function.name async for chunk in stream for ch in chunk.choices
                 for tc in ch.delta.tool_calls or [] if tc.function.name]
    await client.close()
    assert names == ["add"]
    [step] = ctx.recorder.steps()
    assert_exact(step, '{"x": 1}')
    assert step.tool_calls == [{"id": "call_1", "type": "function",
                                "function": {"name": "add", "arguments": '{"x": 1}'}}]


def test_sync_stream_and_plain_httpx_client(fake_upstream, ctx):
    client = openai.OpenAI(base_url=fake_upstream.base_url, api_key="x", max_retries=0)
    with episode_scope(ctx):
        text = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(model="m", messages=MSGS, stream=True) if c.choices)
        r = httpx.post(fake_upstream.base_url + "/chat/completions",
                       json={"model": "m", "messages": MSGS, "logprobs": True})
    assert text == "ok: hello there"
    body = r.json()
    assert body["choices"][0]["logprobs"] is not None  # asked for: kept
    assert "token_ids" not in body["choices"][0]  # not asked for: stripped
    steps = ctx.recorder.steps()
    assert len(steps) == 2
    for step in steps:
        assert_exact(step, "ok: hello there")


def test_outside_an_episode_nothing_is_touched(fake_upstream):
    client = openai.OpenAI(base_url=fake_upstream.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=MSGS)
    assert "return_token_ids" not in fake_upstream.requests[-1] and "logprobs" not in fake_upstream.requests[-1]


def test_calls_to_the_gateway_are_left_to_it_but_get_the_agent_header(fake_upstream):
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        ctx = EpisodeContext(session_id="g", gateway_url=gw.url)
        client = openai.OpenAI(base_url=gw.session_base_url("g"), api_key=gw.client_api_key, max_retries=0)
        with episode_scope(ctx), agent_scope("critic"):
            client.chat.completions.create(model="m", messages=MSGS)
        assert ctx.recorder.steps() == []  # not recorded twice
        [step] = gw.take_steps("g")
    assert step.agent == "critic"
    assert_exact(step, "ok: hello there")


def test_refused_connection_records_an_errored_step_and_raises(ctx):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    with episode_scope(ctx), pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=MSGS)
    [step] = ctx.recorder.steps()
    assert step.error and "Connect" in step.error and not step.trainable


def test_client_closing_a_stream_early_is_recorded_with_an_error(fake_upstream, ctx):
    fake_upstream.responder = lambda body: "x" * 200
    with episode_scope(ctx), httpx.Client() as client, client.stream(
        "POST", fake_upstream.base_url + "/chat/completions",
        json={"model": "m", "messages": MSGS, "stream": True},
    ) as r:
        next(r.iter_bytes())
    [step] = ctx.recorder.steps()
    assert step.error and "closed" in step.error


# ---------------------------------------------------------------------------- assembler on its own
def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks) + b"data: [DONE]\r\n\r\n"


def test_assembler_is_independent_of_how_the_stream_is_split():
    """Interleaved fragments of two tool calls, CRLF separators, fed one byte at a time."""
    raw = _sse(
        {"id": "r", "prompt_token_ids": [1, 2, 3], "policy_version": 4,
         "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "token_ids": [10, 11], "logprobs": {"content": [{"logprob": -1.0},
                                                                                   {"logprob": -2.0}]},
                      "delta": {"tool_calls": [
                          {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}},
                          {"index": 0, "id": "a", "function": {"name": "f", "arguments": "["}}]}}]},
        {"choices": [{"index": 0, "token_ids": [12], "logprobs": {"content": [{"logprob": -3.0}]},
                      "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "]"}},
                                               {"index": 1, "function": {"arguments": "}"}}]},
                      "finish_reason": "tool_calls"}]},
    )
    call, _ = prepare_call(json.dumps({"model": "m", "messages": MSGS, "stream": True}).encode(), "chat",
                           upstream="u", inject=True)
    whole = CallAssembler(call, sse=True)
    out_whole = whole.feed(raw)
    bytewise = CallAssembler(call, sse=True)
    out_bytes = b"".join(bytewise.feed(raw[i:i + 1]) for i in range(len(raw)))
    assert out_whole == out_bytes and b"token_ids" not in out_whole and b"logprob" not in out_whole
    (_, [a]), (_, [b]) = whole.finish(), bytewise.finish()
    assert a.model_dump(exclude={"id", "latency_s"}) == b.model_dump(exclude={"id", "latency_s"})
    assert a.completion_token_ids == [10, 11, 12] and a.logprobs == [-1.0, -2.0, -3.0]
    assert a.prompt_token_ids == [1, 2, 3] and a.policy_version == 4 and a.finish_reason == "tool_calls"
    assert [t["function"] for t in a.tool_calls or []] == [{"name": "f", "arguments": "[]"},
                                                          {"name": "g", "arguments": "{}"}]


def test_assembler_faults_become_errors_not_exceptions():
    call, _ = prepare_call(b'{"model": "m", "messages": []}', "chat", upstream="u", inject=False)
    asm = CallAssembler(call, sse=False)
    asm.feed(b"<html>bad gateway</html>")
    _, [step] = asm.finish()
    assert step.error and "not JSON" in step.error
    # more logprobs than tokens: the logprobs are kept aside, never trained on
    asm = CallAssembler(call, sse=False)
    asm.feed(json.dumps({"prompt_token_ids": [1], "choices": [{"index": 0, "message": {"content": "a"},
                                                               "token_ids": [5], "logprobs": {"content": [
                                                                   {"logprob": -1.0}, {"logprob": -2.0}]}}]}).encode())
    _, [step] = asm.finish()
    assert step.logprobs is None and step.metadata["server_logprobs"] == [-1.0, -2.0] and not step.trainable
    # a stream cut before [DONE]
    asm = CallAssembler(call, sse=True)
    asm.feed(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n')
    _, [step] = asm.finish()
    assert step.error == "stream ended before [DONE]" and step.text == "a"
    # an error event from the server mid-stream
    asm = CallAssembler(call, sse=True)
    asm.feed(b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
             b'data: {"error": {"message": "out of KV cache"}}\n\ndata: [DONE]\n\n')
    _, [step] = asm.finish()
    assert step.error == "upstream error mid-stream: out of KV cache"


# ---------------------------------------------------------------------------- retokenization
@pytest.mark.slow
def test_upstream_without_ids_is_retokenized_and_marked(fake_upstream, tiny_tokenizer):
    up = UpstreamConfig(url=fake_upstream.base_url, inject_token_ids=False, tokenizer=str(tiny_tokenizer))
    with start_gateway([up]) as gw:
        client = openai.OpenAI(base_url=gw.session_base_url("rt"), api_key=gw.client_api_key, max_retries=0)
        client.chat.completions.create(model="m", messages=MSGS)
        client.completions.create(model="m", prompt="2+2=")
        chat, comp = gw.take_steps("rt")
    assert chat.token_source == "retokenized" and chat.logprobs is None and not chat.trainable
    assert chat.prompt_token_ids == [2, 5, 6, 3]  # <|user|> hello there <|assistant|>
    assert chat.completion_token_ids == [4, 5, 6, 1]  # ok: hello there </s> (stopped on its own)
    assert comp.token_source == "retokenized" and comp.prompt_token_ids == [7]


def test_in_process_tokenizer_object_is_used_for_upstreams_without_ids(tiny_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)
    call, _ = prepare_call(json.dumps({"model": "m", "messages": MSGS}).encode(), "chat", upstream="u",
                           inject=False)
    asm = CallAssembler(call, sse=False, tokenizer=tok)
    body = {"choices": [{"index": 0, "message": {"content": "ok: hello"}, "finish_reason": "length"}]}
    assert asm.feed(json.dumps(body).encode()) == json.dumps(body).encode()  # nothing stripped, passed as is
    _, [step] = asm.finish()
    assert step.token_source == "retokenized" and step.completion_token_ids == [4, 5]  # no EOS: cut by length


@pytest.mark.parametrize("streamed", [True, False])
def test_a_server_that_compresses_anyway_is_still_recorded(ctx, streamed):
    """We ask for identity encoding; a server that gzips regardless is decoded for capture, passed on as is.
    `streamed=False`: the transport hands over a body it already read (as httpx.MockTransport does)."""
    import gzip

    body = {"id": "z", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "message": {"content": "hi"},
                                                                "token_ids": [7, 8], "finish_reason": "stop",
                                                                "logprobs": {"content": [{"logprob": -0.5},
                                                                                         {"logprob": -0.25}]}}]}
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"accept-encoding": request.headers.get("accept-encoding"), **json.loads(request.content)})
        gz = gzip.compress(json.dumps(body).encode())
        return httpx.Response(200, content=iter([gz[:9], gz[9:]]) if streamed else gz,
                              headers={"content-type": "application/json", "content-encoding": "gzip"})

    with episode_scope(ctx), httpx.Client(transport=httpx.MockTransport(handler)) as client:
        r = client.post("http://127.0.0.1:9/v1/chat/completions", json={"model": "m", "messages": MSGS})
    assert r.json() == body  # decoded by httpx as usual (nothing stripped from compressed bytes)
    assert seen[0]["accept-encoding"] == "identity" and seen[0]["return_token_ids"] is True
    [step] = ctx.recorder.steps()
    assert step.prompt_token_ids == [1, 2] and step.completion_token_ids == [7, 8]
    assert step.logprobs == [-0.5, -0.25] and step.text == "hi" and step.trainable


@pytest.mark.parametrize("stream", [False, True])
async def test_async_completions_endpoint_in_process(fake_upstream, ctx, stream):
    client = openai.AsyncOpenAI(base_url=fake_upstream.base_url, api_key="x", max_retries=0)
    with episode_scope(ctx):
        out = await client.completions.create(model="m", prompt="2+2=", max_tokens=64, stream=stream)
        text = "".join([c.choices[0].text async for c in out if c.choices]) if stream else out.choices[0].text
    await client.close()
    assert text == "ok: 2+2="
    [step] = ctx.recorder.steps()
    ids = encode("ok: 2+2=")
    assert step.endpoint == "completions" and step.prompt == "2+2=" and step.token_source == "server"
    assert step.prompt_token_ids == encode("2+2=") and step.completion_token_ids == ids
    assert step.logprobs == [token_logprob(t) for t in ids] and step.trainable
