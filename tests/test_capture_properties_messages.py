"""The capture properties (test_capture_properties.py) for the Anthropic Messages API, over generated streams in
any framing and chunking (the same `rendered` / `cut` as the other APIs).

A Messages upstream: (a) nothing stripped → the client gets the upstream's bytes exactly; (b) stripped → its events
parse to the upstream's minus exactly rllm's fields; (c) feed/finish never raise and the stream's end is seen;
(d) one Step, its text the text deltas joined, its tool calls the tool_use blocks' input JSON, its thinking
blocks in metadata, its ids and logprobs the upstream's. A Chat-only upstream (the gateway's translation): the
client's events accumulate, in the anthropic SDK's own accumulator, to the message the Chat stream said, and the
Step is the chat call's.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from anthropic.types import Message
from hypothesis import given
from hypothesis import strategies as st
from test_capture_properties_support import ASKS, FAST, TEXT, cut, parse_sse, rendered, run

from rllm_rollout.capture.assemblers import make_assembler
from rllm_rollout.capture.messages import MessagesAssembler, MessagesViaChatAssembler
from rllm_rollout.capture.request import prepare_call, prepare_messages_via_chat

BODY = {"model": "m", "max_tokens": 32, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
OURS = ("prompt_token_ids", "token_ids", "token_policy_versions", "policy_version", "logprobs")
LP_FIELDS = ("logprobs",)
IDS_FIELDS = ("prompt_token_ids", "token_ids", "token_policy_versions", "policy_version")


def call(asks: tuple[bool, bool]) -> Any:
    wants_lp, wants_ids = asks
    body = {**BODY, **({"logprobs": True} if wants_lp else {}), **({"return_token_ids": True} if wants_ids else {})}
    return prepare_call(json.dumps(body).encode(), "messages", upstream="u", inject=True)[0]


@st.composite
def messages_stream(draw: st.DrawFn) -> tuple[list[Any], dict[str, Any]]:
    """A Messages SSE stream as its events, and what its Step must hold."""
    kinds = draw(st.lists(st.sampled_from(["text", "tool_use", "thinking"]), min_size=1, max_size=3))
    events: list[Any] = []
    want: dict[str, Any] = {"text": [], "tools": [], "thinking": []}
    for index, kind in enumerate(kinds):
        if kind == "text":
            pieces = draw(st.lists(TEXT, max_size=4))
            events.append({"type": "content_block_start", "index": index, "content_block": {"type": "text",
                                                                                           "text": ""}})
            events += [{"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
                       for p in pieces]
            want["text"].append("".join(pieces))
        elif kind == "tool_use":
            args = json.dumps({"cmd": draw(TEXT), "n": draw(st.integers(-5, 5))}, ensure_ascii=draw(st.booleans()))
            points = sorted(draw(st.lists(st.integers(0, len(args)), max_size=4)))
            bounds = [0, *points, len(args)]
            events.append({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": f"toolu_{index}", "name": "bash", "input": {}}})
            events += [{"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": args[a:b]}}
                       for a, b in itertools.pairwise(bounds)]
            want["tools"].append(("bash", json.dumps(json.loads(args))))
        else:
            thought = draw(TEXT)
            events += [{"type": "content_block_start", "index": index, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}},
                {"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta",
                                                                          "thinking": thought}},
                {"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta",
                                                                          "signature": "s"}}]
            want["thinking"].append(thought)
        events.append({"type": "content_block_stop", "index": index})
    ids = draw(st.lists(st.integers(0, 50_000), min_size=1, max_size=8))
    lps = [-round(0.1 * (i % 7), 3) for i in range(len(ids))]
    prompt = draw(st.lists(st.integers(0, 50_000), min_size=1, max_size=6))
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": len(prompt), "output_tokens": 1},
        "prompt_token_ids": prompt, "policy_version": 3}}
    stop = "tool_use" if want["tools"] else draw(st.sampled_from(["end_turn", "max_tokens"]))
    delta = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
             "usage": {"output_tokens": len(ids)}, "token_ids": ids, "token_policy_versions": [3] * len(ids),
             "logprobs": lps}
    pings = [{"type": "ping"}] if draw(st.booleans()) else []
    want.update(ids=ids, lps=lps, prompt=prompt, stop=stop)
    return [start, *pings, *events, delta, {"type": "message_stop"}], want


def stripped(events: list[tuple[str | None, Any]], wants_lp: bool, wants_ids: bool) -> list[Any]:
    out = []
    for _, data in events:
        data = json.loads(json.dumps(data))
        for target in (data, data.get("message")):
            if isinstance(target, dict):
                for key in (() if wants_lp else LP_FIELDS) + (() if wants_ids else IDS_FIELDS):
                    target.pop(key, None)
        out.append(data)
    return out


@FAST
@given(data=st.data(), src=messages_stream(), asks=ASKS)
def test_a_messages_stream_in_any_framing_and_chunking(data: st.DataObject, src: Any, asks: tuple[bool, bool]):
    items, want = src
    raw, _ = data.draw(rendered(items))
    asm = make_assembler(call(asks), sse=True)
    assert isinstance(asm, MessagesAssembler)
    got, steps = run(asm, data.draw(cut(raw)))
    assert asm._failed is None and asm.done  # (c)
    if all(asks):
        assert got == raw  # (a)
    else:
        assert [d for _, d in parse_sse(got)] == stripped(parse_sse(raw), *asks)  # (b)
    [step] = steps  # (d)
    assert step.error is None and step.endpoint == "messages"
    assert step.text == ("".join(want["text"]) if want["text"] else (None if want["tools"] else ""))
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in step.tool_calls or []] == want["tools"]
    assert [b["thinking"] for b in step.metadata.get("thinking", [])] == want["thinking"]
    assert step.completion_token_ids == want["ids"] and step.logprobs == want["lps"]
    assert step.prompt_token_ids == want["prompt"] and step.token_policy_versions == [3] * len(want["ids"])
    assert step.trainable and step.policy_version == 3


@st.composite
def chat_stream(draw: st.DrawFn) -> tuple[list[Any], str, list[tuple[str, dict[str, Any]]], list[int]]:
    """A Chat stream as vLLM sends it (ids and logprobs per chunk): text pieces, then maybe tool calls."""
    calls = [("bash", {"cmd": draw(TEXT)}) for _ in range(draw(st.integers(0, 2)))]
    pieces = draw(st.lists(TEXT, min_size=0 if calls else 1, max_size=4))  # a reply is at least one token
    chunks: list[Any] = [{"id": "c", "model": "m", "prompt_token_ids": [1, 2],
                          "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    ids: list[int] = []
    for p in pieces:
        ids.append(len(ids) + 10)
        chunks.append({"id": "c", "choices": [{"index": 0, "delta": {"content": p}, "token_ids": [ids[-1]],
                                               "logprobs": {"content": [{"token": "t", "logprob": -0.5}]}}]})
    for k, (name, args) in enumerate(calls):
        text = json.dumps(args)
        for j, part in enumerate([text[: len(text) // 2], text[len(text) // 2:]]):
            ids.append(len(ids) + 10)
            frag: dict[str, Any] = {"index": k, "function": {"arguments": part}}
            if j == 0:
                frag.update(id=f"call_{k}", type="function")
                frag["function"]["name"] = name
            chunks.append({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [frag]}, "token_ids": [ids[-1]],
                                                   "logprobs": {"content": [{"token": "t", "logprob": -0.5}]}}]})
    chunks.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls
                                           else "stop"}]})
    chunks += [{"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": len(ids)}}, "[DONE]"]
    return chunks, "".join(pieces), calls, ids


def _accumulate(events: list[dict[str, Any]]) -> Message:
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot, bufs = None, {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump())


@FAST
@given(data=st.data(), src=chat_stream())
def test_a_chat_stream_reaches_a_messages_client_as_the_message_it_said(data: st.DataObject, src: Any):
    chunks, text, calls, ids = src
    raw, _ = data.draw(rendered(chunks))
    translated, _ = prepare_messages_via_chat(json.dumps(BODY).encode(), upstream="u", inject=True)
    asm = make_assembler(translated, sse=True)
    assert isinstance(asm, MessagesViaChatAssembler)
    got, [step] = run(asm, data.draw(cut(raw)))
    events = parse_sse(got)
    assert all(name == event["type"] for name, event in events)  # `event:` names its data, as Anthropic's do
    assert events[-1][1]["type"] == "message_stop"
    message = _accumulate([event for _, event in events])
    assert "".join(b.text for b in message.content if b.type == "text") == text
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == calls
    assert message.stop_reason == ("tool_use" if calls else "end_turn") and message.usage.output_tokens == len(ids)
    assert step.endpoint == "messages" and step.completion_token_ids == ids and step.logprobs == [-0.5] * len(ids)
    assert step.prompt_token_ids == [1, 2] and step.trainable and step.error is None
