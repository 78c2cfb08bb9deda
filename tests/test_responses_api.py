"""The OpenAI Responses API captured end to end: gateway and in-process, openai SDK, LangChain, Agents SDK.

Against the deterministic fake upstream every recorded id and logprob must be exactly what it sent; what
the client did not ask for (logprobs, raw token messages) must never reach it, so the SDK objects equal
those of a direct, uncaptured call. Against our policy server (`tiny-random`) the Step must hold the ids and
logprobs the server itself reports for the same greedy request.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, Runner, function_tool
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from test_adapter_support import expected_reply_ids, fresh_warnings, trajectory_shape  # noqa: F401

import rllm
from rllm_adapters.openai_agents import run_config
from rllm_core.context import EpisodeContext, episode_scope
from rllm_core.types import Step
from rllm_rollout.capture import install
from rllm_rollout.capture.request import endpoint_of, prepare_call
from rllm_rollout.capture.responses import ResponsesAssembler
from rllm_rollout.capture.responses_input import chat_tools, input_to_messages
from rllm_rollout.capture.unrecorded import reset_unrecorded, unrecognized_llm_call, unrecorded_counts
from rllm_rollout.gateway import GatewayHandle, UpstreamConfig, start_gateway
from rllm_testing.fake_upstream import FakeUpstream, encode, start_fake_upstream, token_logprob

TOOLS = [{"type": "function", "name": "add", "description": "add", "parameters": {"type": "object",
                                                                                 "properties": {}}}]


def assert_responses_exact(up: FakeUpstream, step: Step) -> None:
    """The Step holds the fake upstream's own prompt ids, completion ids and logprobs for its request."""
    rid = step.metadata.get("response_id")
    assert rid and rid.startswith("resp_"), step.metadata
    body = up.requests[int(rid.split("_")[1]) - 1]
    assert step.error is None, step.error
    assert step.endpoint == "responses" and step.token_source == "server" and step.trainable
    chat_view = {**body, "messages": input_to_messages(body), "tools": chat_tools(body.get("tools"))}
    ids = expected_reply_ids(up, chat_view)
    assert step.completion_token_ids == ids
    assert step.logprobs == [token_logprob(t) for t in ids]
    assert step.prompt_token_ids == encode(json.dumps([body.get("instructions"), body["input"]], sort_keys=True,
                                                      separators=(",", ":")))
    assert step.messages == input_to_messages(body)


def comparable(obj: Any) -> Any:
    """An SDK object as plain data, without what differs per call (ids, times, sequence numbers)."""
    data = obj.model_dump() if hasattr(obj, "model_dump") else obj
    if isinstance(data, dict):
        return {k: comparable(v) for k, v in data.items()
                if k not in ("id", "item_id", "created_at", "call_id", "sequence_number")}
    if isinstance(data, list):
        return [comparable(v) for v in data]
    return data


@pytest.fixture
def gateway(fake_upstream: FakeUpstream):
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        yield gw


def client_for(gw: GatewayHandle, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.session_base_url(sid), api_key=gw.client_api_key, max_retries=0)


# ------------------------------------------------------------------------------------------- units
def test_endpoint_of_knows_only_the_generating_responses_post() -> None:
    assert endpoint_of("/v1/responses") == "responses" and endpoint_of("v1/responses/") == "responses"
    assert endpoint_of("/v1/responses?x=1") == "responses"
    assert endpoint_of("/v1/responses/resp_1") is None and endpoint_of("/v1/responses/resp_1/input_items") is None
    assert endpoint_of("/v1/chat/completions") == "chat" and endpoint_of("/v1/embeddings") is None


def test_prepare_call_asks_in_vllms_responses_fields_and_only_what_is_missing() -> None:
    raw = json.dumps({"model": "m", "input": "hi", "include": ["reasoning.encrypted_content"]}).encode()
    call, sent = prepare_call(raw, "responses", upstream="http://127.0.0.1:1/v1", inject=True)
    assert json.loads(sent) == {"model": "m", "input": "hi", "top_logprobs": 0, "enable_response_messages": True,
                                "include": ["reasoning.encrypted_content", "message.output_text.logprobs"]}
    assert call.strips and not call.wants_logprobs and not call.wants_token_ids
    assert call.params == {"include": ["reasoning.encrypted_content"]}  # input / instructions are the messages
    asked = json.dumps({"input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 2,
                        "enable_response_messages": True}).encode()
    call, sent = prepare_call(asked, "responses", upstream="u", inject=True)
    assert sent is asked and not call.strips
    call, sent = prepare_call(raw, "responses", upstream="https://api.openai.com/v1", inject=False)
    assert sent is raw  # a hosted API gets the request as the client wrote it


def test_input_items_become_chat_messages() -> None:
    body = {"instructions": "be brief", "input": [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add "},
                                                         {"type": "input_text", "text": "1"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": "{\"x\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
    ]}
    assert input_to_messages(body) == [
        {"role": "system", "content": "be brief"}, {"role": "system", "content": "rules"},
        {"role": "user", "content": "add 1"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{\"x\":1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"}]
    assert input_to_messages({"input": "hi"}) == [{"role": "user", "content": "hi"}]
    assert chat_tools([*TOOLS, {"type": "web_search"}]) == [{"type": "function", "function": {
        "name": "add", "description": "add", "parameters": {"type": "object", "properties": {}}}}]


def _events(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def test_stream_is_done_at_its_final_event_and_cut_streams_and_failures_are_errors() -> None:
    call, _ = prepare_call(b'{"input": "hi"}', "responses", upstream="u", inject=False)
    asm = ResponsesAssembler(call, sse=True)
    head = _events({"type": "response.created", "response": {"id": "resp_9", "output": []}},
                   {"type": "response.output_text.delta", "output_index": 0, "delta": "he", "logprobs": []},
                   {"type": "response.output_text.delta", "output_index": 0, "delta": "y", "logprobs": []})
    assert asm.feed(head) == head and not asm.done
    _, [cut] = ResponsesAssembler.finish(asm)
    assert cut.text == "hey" and cut.error == "stream ended before response.completed"

    asm = ResponsesAssembler(call, sse=True)
    asm.feed(head + _events({"type": "error", "code": "server_error", "message": "boom"}))
    final = _events({"type": "response.failed", "response": {"id": "resp_9", "status": "failed", "output": [],
                                                             "error": {"code": "server_error", "message": "boom"}}})
    asm.feed(final[:10])
    assert not asm.done
    asm.feed(final[10:])
    assert asm.done  # recorded at this event, before the client sees it
    _, [failed] = asm.finish()
    assert failed.finish_reason == "error" and "boom" in (failed.error or "") and failed.text == "hey"


def test_the_final_event_is_seen_in_pass_through_and_only_by_its_type() -> None:
    call, _ = prepare_call(b'{"input": "hi"}', "responses", upstream="u", inject=True)
    asm = ResponsesAssembler(call, sse=True)
    asm._absorb_chunk = lambda chunk: 1 / 0  # type: ignore[method-assign]  # the first event fails: pass-through
    stream = _events({"type": "response.created", "response": {"id": "resp_9", "output": []}},
                     {"type": "response.output_text.delta", "output_index": 0, "delta": "response.completed"})
    assert asm.feed(stream) == stream and not asm.done  # the name inside a text delta ends nothing
    final = _events({"type": "response.incomplete", "response": {"id": "resp_9", "status": "incomplete",
                                                                 "output": []}})
    assert asm.feed(final) == final and asm.done
    _, [step] = asm.finish()
    assert step.error and step.error.startswith("capture failed (ZeroDivisionError")
    assert step.messages == [{"role": "user", "content": "hi"}]


# ------------------------------------------------------------------------------ gateway + fake upstream
def test_gateway_records_a_response_exactly_and_the_client_sees_the_uncaptured_one(
        gateway: GatewayHandle, fake_upstream: FakeUpstream) -> None:
    client = client_for(gateway, "r1")
    r = client.responses.create(model="fake", input="hello there", instructions="be nice")
    [step] = gateway.take_steps("r1")
    assert_responses_exact(fake_upstream, step)
    assert step.text == r.output_text == "ok: hello there" and step.finish_reason == "stop"
    assert step.messages == [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello there"}]
    assert step.usage and step.usage["input_tokens"] == step.usage["prompt_tokens"] == len(step.prompt_token_ids)
    direct = openai.OpenAI(base_url=fake_upstream.base_url, api_key="x", max_retries=0).responses.create(
        model="fake", input="hello there", instructions="be nice")
    assert comparable(r) == comparable(direct)  # injected fields stripped: the same object as without capture
    assert r.output[0].content[0].logprobs is None and r.model_extra.get("output_messages") is None


def test_fields_the_client_asked_for_reach_it(gateway: GatewayHandle, fake_upstream: FakeUpstream) -> None:
    r = client_for(gateway, "r2").responses.create(model="fake", input="hi", include=["message.output_text.logprobs"],
                                                   extra_body={"enable_response_messages": True})
    [step] = gateway.take_steps("r2")
    assert_responses_exact(fake_upstream, step)
    assert [lp.logprob for lp in r.output[0].content[0].logprobs] == step.logprobs
    assert r.model_extra["output_messages"][0]["tokens"] == step.completion_token_ids


@pytest.mark.parametrize("use_tools", [False, True], ids=["text", "tool_call"])
def test_gateway_streaming_records_before_the_last_event_and_passes_events_through(
        gateway: GatewayHandle, fake_upstream: FakeUpstream, use_tools: bool) -> None:
    kw: dict[str, Any] = {"tools": TOOLS} if use_tools else {}
    events = list(client_for(gateway, "r3").responses.create(model="fake", input="stream me", stream=True, **kw))
    direct = list(openai.OpenAI(base_url=fake_upstream.base_url, api_key="x", max_retries=0).responses.create(
        model="fake", input="stream me", stream=True, **kw))
    assert [comparable(e) for e in events] == [comparable(e) for e in direct]
    [step] = gateway.take_steps("r3")
    assert_responses_exact(fake_upstream, step)
    if use_tools:
        assert step.tool_calls == [{"id": "call_1", "type": "function",
                                    "function": {"name": "add", "arguments": '{"x": 1}'}}]
        assert step.finish_reason == "tool_calls" and step.text is None
    else:
        assert step.text == "ok: stream me" and events[-1].type == "response.completed"
    with httpx.stream("POST", gateway.session_base_url("r4") + "/responses", json={"input": "raw", "stream": True},
                      headers={"Authorization": f"Bearer {gateway.client_api_key}"}) as resp:
        lines = [ln for ln in resp.iter_lines() if ln]
    names = [ln[7:] for ln in lines if ln.startswith("event: ")]
    datas = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
    assert names == [d["type"] for d in datas] and names[-1] == "response.completed"  # event lines kept
    assert all(d.get("logprobs") in (None, []) for d in datas) and datas[-1]["response"]["input_messages"] is None


def _broken(body: dict[str, Any]) -> str:
    raise RuntimeError("the upstream broke")  # the fake upstream answers HTTP 500


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("transport", ["gateway", "inprocess"])
def test_an_upstream_500_keeps_the_responses_prompt_in_its_errored_step(transport: str, stream: bool) -> None:
    """An errored Step is the record of what was asked: a Responses call's is its instructions + input."""
    ask = {"model": "fake", "instructions": "be brief", "stream": stream,
           "input": [{"role": "user", "content": [{"type": "input_text", "text": "add 1"}]}]}
    with start_fake_upstream(responder=_broken) as up, start_gateway([UpstreamConfig(url=up.base_url)]) as gw:
        if transport == "gateway":
            with pytest.raises(openai.InternalServerError):
                client_for(gw, "e500").responses.create(**ask)
            [step] = gw.take_steps("e500")
        else:
            install()
            ctx = EpisodeContext(session_id="e500")
            with episode_scope(ctx), pytest.raises(openai.InternalServerError):
                openai.OpenAI(base_url=up.base_url, api_key="x", max_retries=0).responses.create(**ask)
            [step] = ctx.recorder.steps()
    assert step.endpoint == "responses" and step.model == "fake" and not step.trainable
    assert step.error and "500" in step.error, step.error
    assert step.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add 1"}]


# ------------------------------------------------------------------------------ in-process: openai SDK
def endpoint(config: rllm.RolloutConfig) -> str:
    return str(config.upstream_url) if getattr(config, "direct", False) else config.base_url


def api_key(config: rllm.RolloutConfig) -> str:
    return "EMPTY" if getattr(config, "direct", False) else config.api_key


@rllm.rollout
def sdk_sync(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    client = openai.OpenAI(base_url=endpoint(config), api_key=api_key(config), max_retries=0)
    text = client.responses.create(model="fake", input=str(task.instruction)).output_text
    for _ in client.responses.create(model="fake", input=[{"role": "user", "content": "again"}], tools=TOOLS,
                                     stream=True):
        pass
    return text


@rllm.rollout
async def sdk_async(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    client = openai.AsyncOpenAI(base_url=endpoint(config), api_key=api_key(config), max_retries=0)
    stream = await client.responses.create(model="fake", input=str(task.instruction), stream=True)
    async for _ in stream:
        pass
    return (await client.responses.create(model="fake", input="second")).output_text


@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
def test_openai_sdk_sync_responses_are_captured(fake_upstream: FakeUpstream, direct: bool) -> None:
    episode = sdk_sync.run({"id": "s", "instruction": "sync q"}, base_url=fake_upstream.base_url, direct=direct)
    assert episode.termination_reason == "completed", episode.error
    text_step, tool_step = episode.steps
    assert text_step.text == "ok: sync q" and tool_step.tool_calls[0]["function"]["name"] == "add"
    for step in episode.steps:
        assert_responses_exact(fake_upstream, step)
    assert episode.metrics["capture/unrecorded_calls"] == 0


@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
async def test_openai_sdk_async_responses_are_captured(fake_upstream: FakeUpstream, direct: bool) -> None:
    episode = await sdk_async.arun({"id": "a", "instruction": "async q"}, base_url=fake_upstream.base_url,
                                   direct=direct)
    assert [s.text for s in episode.steps] == ["ok: async q", "ok: second"], episode.error
    for step in episode.steps:
        assert_responses_exact(fake_upstream, step)


# ------------------------------------------------------------------------------------------ LangChain
@tool
def add(x: int) -> int:
    """Add one to x."""
    return x + 1


@rllm.rollout
def langchain_rollout(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    llm = ChatOpenAI(model="fake", base_url=endpoint(config), api_key=api_key(config), max_retries=0,
                     use_responses_api=True, streaming=bool(getattr(config, "stream", False)))
    first = llm.bind_tools([add]).invoke(str(task.instruction))
    assert first.tool_calls and first.tool_calls[0]["name"] == "add"
    reply = llm.invoke([("human", str(task.instruction)), first,
                        {"role": "tool", "content": "2", "tool_call_id": first.tool_calls[0]["id"]}])
    return str(reply.text)


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
def test_langchain_chatopenai_with_the_responses_api_is_captured(fake_upstream: FakeUpstream, direct: bool,
                                                                 stream: bool) -> None:
    episode = langchain_rollout.run({"id": "lc", "instruction": "add one"}, base_url=fake_upstream.base_url,
                                    direct=direct, stream=stream)
    assert episode.termination_reason == "completed", episode.error
    first, second = episode.steps
    assert first.tool_calls and first.tool_calls[0]["function"]["name"] == "add"
    assert [m["role"] for m in second.messages or []] == ["user", "assistant", "tool"]
    assert second.messages[1]["tool_calls"][0]["id"] == first.tool_calls[0]["id"]
    for step in episode.steps:
        assert_responses_exact(fake_upstream, step)
    assert all("input" in r for r in fake_upstream.requests)  # it really spoke the Responses API


# ------------------------------------------------------------------------------- OpenAI Agents SDK
@function_tool
def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


@rllm.rollout
async def agents_default(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    agent = Agent(name="math", instructions="Use the tool.", tools=[add_one])
    cfg = run_config(config, use_responses=getattr(config, "use_responses", None))
    if getattr(config, "stream", False):
        streamed = Runner.run_streamed(agent, str(task.instruction), run_config=cfg)
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)
    return str((await Runner.run(agent, str(task.instruction), run_config=cfg)).final_output)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_agents_sdk_default_responses_model_is_captured(fake_upstream: FakeUpstream, stream: bool) -> None:
    episode = await agents_default.arun({"id": "ag", "instruction": "2+2"}, base_url=fake_upstream.base_url,
                                        stream=stream)
    assert episode.termination_reason == "completed", episode.error
    assert trajectory_shape(episode) == [("math", 2)]
    first, second = episode.steps
    assert first.tool_calls and first.tool_calls[0]["function"]["name"] == "add_one"
    assert any(m.get("role") == "tool" for m in second.messages or [])
    assert second.messages[0] == {"role": "system", "content": "Use the tool."}
    for step in episode.steps:
        assert_responses_exact(fake_upstream, step)
        assert step.metadata["framework"] == "openai_agents"
    assert all("input" in r and "messages" not in r for r in fake_upstream.requests)


async def test_agents_sdk_chat_completions_stays_an_opt_in(fake_upstream: FakeUpstream) -> None:
    episode = await agents_default.arun({"id": "cc", "instruction": "2+2"}, base_url=fake_upstream.base_url,
                                        use_responses=False)
    assert [s.endpoint for s in episode.steps] == ["chat", "chat"], episode.error
    assert all("messages" in r for r in fake_upstream.requests)


# -------------------------------------------------------------------------- loud, never silent
@rllm.rollout
def unknown_calls(task: rllm.Task, config: rllm.RolloutConfig) -> None:
    with httpx.Client(base_url=endpoint(config), headers={"Authorization": f"Bearer {api_key(config)}"}) as c:
        for _ in range(2):
            c.post("/generate", json={"prompt": "hi"})  # vLLM's native route: a generation capture cannot read
        c.post("/responses/resp_1/cancel", json={})
        c.post("/embeddings", json={"model": "e", "input": "not a generation"})


def test_an_unrecognized_llm_call_warns_once_and_is_counted(fake_upstream: FakeUpstream,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """In-process capture passes such calls through: they are warned about and counted. (The gateway refuses
    them outright with a 404 naming the routes it forwards.)"""
    reset_unrecorded()
    with caplog.at_level(logging.WARNING, logger="rllm.capture"):
        episode = unknown_calls.run({"id": "u"}, base_url=fake_upstream.base_url, direct=True)
    assert episode.termination_reason == "completed", episode.error
    assert episode.metrics["capture/unrecorded_calls"] == 3
    assert unrecorded_counts() == {"/v1/generate": 2, "/v1/responses/resp_1/cancel": 1}
    warned = [r.getMessage() for r in caplog.records if "did not record" in r.getMessage()]
    assert len(warned) == 2 and "native /generate" in warned[0]  # once per (host, path)
    assert unrecognized_llm_call("/v1/embeddings") is None and unrecognized_llm_call("/generate")
    assert unrecognized_llm_call("/v1beta/models/g:generateContent") and unrecognized_llm_call("/api/chat")


# ----------------------------------------------------------------------- our policy server (tiny-random)
@pytest.fixture(scope="module")
def policy_server() -> Any:
    import torch

    from rllm_serve import load_model, start_policy_server

    torch.set_num_threads(1)
    with start_policy_server(load_model("tiny-random"), max_batch_size=8) as s:
        yield s


ASK = {"include": ["message.output_text.logprobs"], "enable_response_messages": True}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_policy_server_responses_through_the_gateway_carry_the_servers_own_ids(policy_server: Any,
                                                                               stream: bool) -> None:
    body = {"model": "tiny-random", "input": [{"role": "user", "content": "What is two plus two?"}],
            "instructions": "Answer briefly.", "max_output_tokens": 6, "temperature": 0}
    own = httpx.post(policy_server.base_url + "/responses", json={**body, **ASK}, timeout=60).json()
    with start_gateway([UpstreamConfig(url=policy_server.base_url)]) as gw:
        client = client_for(gw, "p")
        if stream:
            events = list(client.responses.create(**body, stream=True))
            assert events[-1].type == "response.incomplete" and events[0].type == "response.created"
            assert all(getattr(e, "logprobs", []) == [] for e in events)  # nothing asked, nothing shown
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        else:
            r = client.responses.create(**body)
            assert r.model_extra.get("output_messages") is None and r.output[0].content[0].logprobs is None
            text = r.output_text
        [step] = gw.take_steps("p")
    assert step.endpoint == "responses" and step.token_source == "server" and step.trainable
    assert step.prompt_token_ids == own["input_messages"][0]["tokens"]
    assert step.completion_token_ids == own["output_messages"][0]["tokens"]
    assert step.logprobs == pytest.approx([e["logprob"] for e in own["output"][0]["content"][0]["logprobs"]],
                                          abs=1e-4)
    assert step.text == text == own["output"][0]["content"][0]["text"] and step.finish_reason == "length"
    assert step.usage and step.usage["output_tokens"] == 6 and step.policy_version == 0
    assert step.messages == [{"role": "system", "content": "Answer briefly."},
                             {"role": "user", "content": "What is two plus two?"}]


def test_policy_server_parses_tool_calls_into_function_call_items(policy_server: Any) -> None:
    from rllm_serve.protocol import ResponsesRequest
    from rllm_serve.responses import ChoiceResult
    from rllm_serve.responses_api import ResponsesBuilder

    tok = policy_server.loaded.tokenizer
    text = 'Sure.<tool_call>{"name": "add", "arguments": {"x": 1}}</tool_call>'
    ids = list(tok.encode(text, add_special_tokens=False))
    r = ChoiceResult(0, token_ids=ids, logprobs=[-0.5] * len(ids), tops=[[]] * len(ids), text=text,
                     finish_reason="stop")
    req = ResponsesRequest.model_validate({"input": "q", "tools": TOOLS, **ASK})
    body = ResponsesBuilder(tok, "tiny-random", [1, 2], req, parse_tools=True).full(r)
    message, call = body["output"]
    assert message["content"][0]["text"] == "Sure." and message["content"][0]["logprobs"] == []
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "add", {"x": 1})
    assert body["output_messages"][0]["logprobs"] == [-0.5] * len(ids)  # every token's, tool call included
    call_, _ = prepare_call(json.dumps({"input": "q", "tools": TOOLS}).encode(), "responses", upstream="u",
                            inject=True)
    asm = ResponsesAssembler(call_, sse=False)
    asm.feed(json.dumps(body).encode())
    _, [step] = asm.finish()
    assert step.tool_calls and step.tool_calls[0]["function"]["name"] == "add" and step.text == "Sure."
    assert step.completion_token_ids == ids and step.logprobs == [-0.5] * len(ids) and step.trainable


@pytest.mark.parametrize(("extra", "needle"), [
    ({"previous_response_id": "resp_1"}, "stores none"), ({"tools": [{"type": "web_search"}]}, "function tools"),
    ({"input": ""}, "input is empty"), ({"text": {"format": {"type": "json_schema"}}}, "structured output"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "no message"),
])
def test_policy_server_refuses_what_it_cannot_honour_with_what_to_do(policy_server: Any, extra: dict[str, Any],
                                                                     needle: str) -> None:
    r = httpx.post(policy_server.base_url + "/responses", json={"input": "q", **extra}, timeout=60)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_policy_server_seed_reproduces_a_sampled_response(policy_server: Any) -> None:
    body = {"input": "hi", "max_output_tokens": 5, "temperature": 1.0, "top_p": 0.9, "seed": 7, **ASK}
    a, b = (httpx.post(policy_server.base_url + "/responses", json=body, timeout=60).json() for _ in range(2))
    assert a["output_messages"][0]["tokens"] == b["output_messages"][0]["tokens"]
    assert a["top_p"] == 0.9 and a["max_output_tokens"] == 5


def test_unrecorded_counts_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm_rollout.capture import unrecorded

    monkeypatch.setattr(unrecorded, "_MAX_KEPT", 3)
    unrecorded.reset_unrecorded()
    try:
        for i in range(5):
            unrecorded.note_unrecorded(f"/v1/messages{i}", "test", host="h", session=f"s{i}")
        assert len(unrecorded._by_session) == 3 and len(unrecorded._warned) <= 3
        assert unrecorded.take_unrecorded("s4") == 1 and unrecorded.take_unrecorded("s0") == 0
        assert sum(unrecorded.unrecorded_counts().values()) == 5  # the totals keep every call
    finally:
        unrecorded.reset_unrecorded()
