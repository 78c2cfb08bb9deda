"""The Anthropic Messages API captured end to end: the anthropic SDK (sync, async, streamed or not, tool_use round
trips) through the gateway and in-process, against the fake upstream and against our policy server (tiny-random).

Against the fake every recorded id and logprob must be exactly what it sent; the SDK objects must equal those of
a direct, uncaptured call (nothing we asked for on the client's behalf reaches it). A Chat-only upstream gets the
Chat translation and the client the Messages reply; a Messages upstream gets the call as it is.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import pytest
from test_responses_api import comparable

import rllm
from rllm_core.types import Step, Trajectory
from rllm_rollout.capture.messages_chat import messages_to_chat
from rllm_rollout.gateway import GatewayHandle, UpstreamConfig, start_gateway
from rllm_testing.fake_upstream import FakeUpstream, encode, start_fake_upstream, token_logprob
from rllm_train.packing import pack_trajectory

TOOLS = [{"name": "add", "description": "add one", "input_schema": {"type": "object",
                                                                   "properties": {"x": {"type": "integer"}}}}]
ASK = {"messages": [{"role": "user", "content": "hello there"}], "system": "Be brief.", "max_tokens": 64,
       "model": "fake-model"}


def sdk(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="EMPTY", max_retries=0)


def asdk(base_url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="EMPTY", max_retries=0)


def call(client: anthropic.Anthropic, stream: bool, **body: Any) -> anthropic.types.Message:
    if stream:
        with client.messages.stream(**body) as s:
            return s.get_final_message()
    return client.messages.create(**body)


async def acall(client: anthropic.AsyncAnthropic, stream: bool, **body: Any) -> anthropic.types.Message:
    if stream:
        async with client.messages.stream(**body) as s:
            return await s.get_final_message()
    return await client.messages.create(**body)


def assert_exact(up: FakeUpstream, step: Step, body: dict[str, Any]) -> None:
    """The Step holds the fake's own prompt ids, completion ids and logprobs for this Messages request."""
    chat = messages_to_chat(body)
    assert step.error is None and step.endpoint == "messages" and step.token_source == "server" and step.trainable
    assert step.messages == chat["messages"]
    assert step.prompt_token_ids == encode(json.dumps(chat["messages"], sort_keys=True, separators=(",", ":")))
    reply = json.dumps(json.loads(step.tool_calls[0]["function"]["arguments"])) if step.tool_calls else step.text
    assert step.completion_token_ids == encode(reply or "")
    assert step.logprobs == [token_logprob(t) for t in step.completion_token_ids]
    assert step.metadata["api"] == "messages"


@pytest.fixture(params=["chat", "native"])
def gateway(request: pytest.FixtureRequest, fake_upstream: FakeUpstream):
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url, messages_api=request.param)]) as gw:
        yield gw


def root(gw: GatewayHandle, sid: str) -> str:
    return gw.session_base_url(sid).removesuffix("/v1")


# ------------------------------------------------------------------------------------------- the gateway
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_sdk_through_the_gateway_is_recorded_exactly_and_sees_what_a_direct_call_sees(
        fake_upstream: FakeUpstream, gateway: GatewayHandle, stream: bool) -> None:
    direct = call(sdk(fake_upstream.url), stream, **ASK)
    got = call(sdk(root(gateway, "s")), stream, **ASK)
    assert comparable(got) == comparable(direct) and got.content[0].text == "ok: hello there"
    [step] = gateway.take_steps("s")
    assert_exact(fake_upstream, step, ASK)
    assert step.text == "ok: hello there" and step.finish_reason == "stop"
    assert step.usage and step.usage["completion_tokens"] == len(step.completion_token_ids)
    translated = gateway.config.upstreams[0].messages_api == "chat"
    assert ("translated" in step.metadata) is translated
    sent = fake_upstream.requests[-1]
    assert ("messages" in sent and "system" not in sent) if translated else sent.get("system") == "Be brief."


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_async_sdk_tool_use_round_trip_is_two_exact_steps(fake_upstream: FakeUpstream, gateway: GatewayHandle,
                                                          stream: bool) -> None:
    async def agent() -> list[anthropic.types.Message]:
        client = asdk(root(gateway, "t"))
        history: list[dict[str, Any]] = [{"role": "user", "content": "add one to one"}]
        first = await acall(client, stream, model="m", max_tokens=64, messages=history, tools=TOOLS)
        [use] = [b for b in first.content if b.type == "tool_use"]
        history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "2"}]}]
        second = await acall(client, stream, model="m", max_tokens=64, messages=history, tools=TOOLS)
        return [first, second]

    first, second = asyncio.run(agent())
    assert first.stop_reason == "tool_use" and first.content[0].input == {"x": 1}
    assert second.stop_reason == "end_turn" and second.content[0].text == "ok: 2"
    one, two = gateway.take_steps("t")
    assert one.tool_calls and one.tool_calls[0]["function"]["name"] == "add" and one.finish_reason == "tool_calls"
    assert one.params["tools"][0]["function"]["name"] == "add"  # chat-form tools: what the template renders
    assert two.messages[-1] == {"role": "tool", "tool_call_id": first.content[0].id, "content": "2"}
    assert two.messages[1]["tool_calls"][0]["function"]["name"] == "add"
    assert all(s.trainable and s.endpoint == "messages" for s in (one, two))


def test_the_sdk_handed_config_base_url_as_is_reaches_the_gateway(fake_upstream: FakeUpstream) -> None:
    """The SDK appends /v1/messages to its base URL: handed `config.base_url` (…/v1) it calls …/v1/v1/messages."""
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        got = sdk(gw.session_base_url("v")).messages.create(**ASK)
        assert got.content[0].text == "ok: hello there" and len(gw.take_steps("v")) == 1


def test_thinking_blocks_are_kept_in_metadata_and_not_rendered(fake_upstream: FakeUpstream) -> None:
    thinking = {"type": "thinking", "thinking": "count words", "signature": "sig"}
    body = {**ASK, "messages": [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": [thinking, {"type": "text", "text": "a"}]},
                                {"role": "user", "content": "again"}]}
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        sdk(root(gw, "k")).messages.create(**body)
        [step] = gw.take_steps("k")
    assert step.metadata["thinking"] == [thinking]
    assert step.messages[2] == {"role": "assistant", "content": "a"}


def test_a_hosted_messages_upstream_without_ids_gives_an_untrainable_step_never_a_silent_one(
        fake_upstream: FakeUpstream) -> None:
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url, messages_api="native",
                                       inject_token_ids=False)]) as gw:
        got = sdk(root(gw, "h")).messages.create(**ASK)
        [step] = gw.take_steps("h")
    assert got.content[0].text == step.text == "ok: hello there"
    assert step.token_source == "none" and not step.trainable and step.completion_token_ids is None
    assert "return_token_ids" not in fake_upstream.requests[-1]


def test_what_has_no_chat_form_is_refused_in_the_anthropic_shape(fake_upstream: FakeUpstream) -> None:
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw, \
            pytest.raises(anthropic.BadRequestError, match="document"):
        sdk(root(gw, "x")).messages.create(**{**ASK, "messages": [{"role": "user", "content": [document]}]})
    assert fake_upstream.requests == []  # nothing reached the upstream


def test_an_upstream_error_reaches_the_sdk_as_an_anthropic_error_and_is_recorded(fake_upstream: FakeUpstream) -> None:
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        r = httpx.post(gw.session_base_url("e") + "/messages", json={**ASK, "messages": "not a list"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages must be"), r.text
    with start_fake_upstream(responder=lambda body: 1 / 0) as broken, \
            start_gateway([UpstreamConfig(url=broken.base_url)]) as gw:
        with pytest.raises(anthropic.InternalServerError, match="upstream returned HTTP 500"):
            sdk(root(gw, "e")).messages.create(**ASK)
        [step] = gw.take_steps("e")
    assert step.endpoint == "messages" and "HTTP 500" in (step.error or "") and step.messages


def test_the_gateway_drops_the_agents_x_api_key_and_accepts_its_token_there(fake_upstream: FakeUpstream) -> None:
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url, messages_api="native")],
                       api_key="gw-token") as gw:
        sdk(root(gw, "a")).messages.create(**ASK)  # the session URL is its own proof: the key is ignored
        assert fake_upstream.authorizations[-1] is None  # ... and never forwarded
        client = anthropic.Anthropic(base_url=gw.url, api_key="gw-token", max_retries=0)
        client.messages.create(**ASK)  # the default session with the token in x-api-key
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=gw.url, api_key="wrong", max_retries=0).messages.create(**ASK)


# ------------------------------------------------------------------------------------------- in-process
@rllm.rollout
def claude_agent(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    client = anthropic.Anthropic(base_url=config.anthropic_base_url, api_key="EMPTY", max_retries=0)
    first = client.messages.create(model=config.model, max_tokens=64, messages=[{"role": "user",
                                                                                 "content": task.instruction}])
    with client.messages.stream(model=config.model, max_tokens=64, tools=TOOLS,
                                messages=[{"role": "user", "content": "use the tool"}]) as s:
        s.get_final_message()
    return first.content[0].text


@pytest.mark.parametrize("direct", [True, False], ids=["in_process", "gateway"])
def test_an_anthropic_agent_unchanged_is_captured_in_process_and_through_the_gateway(
        fake_upstream: FakeUpstream, direct: bool) -> None:
    episode = claude_agent.run({"id": "c", "instruction": "hi"}, base_url=fake_upstream.base_url, direct=direct)
    assert episode.termination_reason == "completed", episode.error
    text, tool = episode.steps
    assert text.text == "ok: hi" and tool.tool_calls and tool.tool_calls[0]["function"]["name"] == "add"
    for step, body in ((text, {"messages": [{"role": "user", "content": "hi"}]}),
                       (tool, {"messages": [{"role": "user", "content": "use the tool"}]})):
        assert_exact(fake_upstream, step, body)
    assert episode.metrics.get("capture/unrecorded_calls", 0) == 0


# ------------------------------------------------------------------------------- our policy server (tiny-random)
@pytest.fixture(scope="module")
def policy_server() -> Any:
    import torch

    from rllm_serve import load_model, start_policy_server

    torch.set_num_threads(1)
    with start_policy_server(load_model("tiny-random"), max_batch_size=8) as s:
        yield s


GREEDY = {"model": "tiny-random", "max_tokens": 6, "system": "Answer.",
          "messages": [{"role": "user", "content": "What is two plus two?"}]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_policy_server_speaks_messages_natively_with_the_chat_paths_tokens(policy_server: Any, stream: bool) -> None:
    ours = {"temperature": 0, "return_token_ids": True, "logprobs": True}
    chat = httpx.post(policy_server.base_url + "/chat/completions", json={
        **messages_to_chat(GREEDY), **ours}, timeout=60).json()
    if stream:
        r = httpx.post(policy_server.base_url + "/messages", json={**GREEDY, **ours, "stream": True}, timeout=60)
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
        assert events[-1]["type"] == "message_stop"
        start, delta = events[0]["message"], events[-2]
        prompt_ids, ids, lps = start["prompt_token_ids"], delta["token_ids"], delta["logprobs"]
        text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
        stop = delta["delta"]["stop_reason"]
    else:
        m = httpx.post(policy_server.base_url + "/messages", json={**GREEDY, **ours}, timeout=60).json()
        prompt_ids, ids, lps, text, stop = (m["prompt_token_ids"], m["token_ids"], m["logprobs"],
                                            m["content"][0]["text"], m["stop_reason"])
    assert prompt_ids == chat["prompt_token_ids"] and ids == chat["choices"][0]["token_ids"]
    assert lps == pytest.approx([e["logprob"] for e in chat["choices"][0]["logprobs"]["content"]], abs=1e-4)
    assert text == chat["choices"][0]["message"]["content"] and stop == "max_tokens"
    plain = sdk(policy_server.base_url.removesuffix("/v1")).messages.create(**GREEDY, extra_body={"temperature": 0})
    assert plain.model_extra == {} and plain.content[0].text == text  # nothing of ours unasked


@pytest.mark.parametrize("mode", ["chat", "native"])
def test_policy_server_multi_turn_messages_continue_token_exactly_through_the_gateway(policy_server: Any,
                                                                                      mode: str) -> None:
    with start_gateway([UpstreamConfig(url=policy_server.base_url, messages_api=mode, exact_turns=True)]) as gw:
        client = sdk(root(gw, "m"))
        first = client.messages.create(**GREEDY, extra_body={"temperature": 0})
        history = [*GREEDY["messages"], {"role": "assistant", "content": first.content[0].text},
                   {"role": "user", "content": "And three?"}]
        call(client, True, **{**GREEDY, "messages": history}, extra_body={"temperature": 0})
        a, b = gw.take_steps("m")
    assert a.trainable and b.trainable and a.endpoint == b.endpoint == "messages"
    assert b.prompt_token_ids[:len(a.prompt_token_ids) + len(a.completion_token_ids)] == \
        a.prompt_token_ids + a.completion_token_ids  # the sampled tokens, not a re-rendering of their text
    rows, _ = pack_trajectory(Trajectory(steps=[a, b]), 1.0)
    assert len(rows) == 1  # one training row for the whole Messages conversation


def test_policy_server_replies_with_tools_parse_into_tool_use_blocks_and_whole_stream_chunks(policy_server: Any
                                                                                             ) -> None:
    from rllm_serve.messages_api import MessagesCall
    from rllm_serve.responses import ChoiceResult, ResponseBuilder

    tok = policy_server.loaded.tokenizer
    text = 'Sure.<tool_call>{"name": "add", "arguments": {"x": 1}}</tool_call>'
    ids = list(tok.encode(text, add_special_tokens=False))
    result = ChoiceResult(0, token_ids=ids, logprobs=[-0.5] * len(ids), tops=[[]] * len(ids), text=text,
                          finish_reason="stop", token_versions=[0] * len(ids))
    builder = ResponseBuilder(tok, "tiny-random", True, [1, 2], True, True, parse_tools=True)
    message = MessagesCall(builder, {"return_token_ids": True, "logprobs": True}).message(result)
    assert [b["type"] for b in message["content"]] == ["text", "tool_use"] and message["stop_reason"] == "tool_use"
    assert message["content"][1]["input"] == {"x": 1} and message["token_ids"] == ids
    assert message["logprobs"] == [-0.5] * len(ids) and message["prompt_token_ids"] == [1, 2]
    chunks = [json.loads(line[6:]) for line in builder.whole_chunks(result).decode().splitlines()
              if line.startswith("data: ")]
    delta = chunks[0]["choices"][0]
    assert delta["delta"]["content"] == "Sure." and delta["delta"]["tool_calls"][0]["index"] == 0
    assert delta["token_ids"] == ids and len(delta["logprobs"]["content"]) == len(ids)
    assert chunks[1]["choices"][0]["finish_reason"] == "tool_calls"
