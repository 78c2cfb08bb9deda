"""Anthropic Messages ↔ Chat Completions translation (rllm_rollout.capture.messages_chat): requests render as the
same conversation, replies parse as the SDK's own Message, and what has no Chat form is refused by name."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message

from rllm_core.errors import CaptureError
from rllm_rollout.capture.messages_chat import ChatStreamToMessages, chat_to_message, messages_to_chat, thinking_blocks

TOOL = {"name": "bash", "description": "run a command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}


def _agent_turns() -> dict:
    """A coding agent's second call: it ran a tool, got a (failed) result, and thought about it."""
    return {
        "model": "policy", "max_tokens": 256, "temperature": 1.0, "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["</done>"], "tools": [TOOL], "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": "List the files."},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "ls will do", "signature": "sig"},
                {"type": "text", "text": "Running ls."},
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.txt"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "denied", "is_error": True},
                {"type": "text", "text": "Now count them."}]},
        ],
    }


def test_a_messages_request_becomes_the_chat_request_a_template_renders_alike() -> None:
    chat = messages_to_chat(_agent_turns())
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "Running ls.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: denied"},
        {"role": "user", "content": "Now count them."},
    ]
    assert (chat["model"], chat["max_tokens"], chat["temperature"], chat["stop"]) == ("policy", 256, 1.0, ["</done>"])
    assert chat["tools"] == [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                                               "parameters": TOOL["input_schema"]}}]
    assert chat["tool_choice"] == "auto" and "stream" not in chat
    assert thinking_blocks(_agent_turns()) == [{"type": "thinking", "thinking": "ls will do", "signature": "sig"}]


def test_streaming_and_forced_tools_carry_over() -> None:
    body = {**_agent_turns(), "stream": True, "tool_choice": {"type": "tool", "name": "bash"}, "system": "Hi."}
    chat = messages_to_chat(body)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "bash"}}
    assert chat["messages"][0] == {"role": "system", "content": "Hi."}
    assert messages_to_chat({**body, "tool_choice": {"type": "any"}})["tool_choice"] == "required"


def test_what_has_no_chat_form_is_refused_by_name() -> None:
    document = {"role": "user", "content": [{"type": "document", "source": {"type": "base64", "data": "..."}}]}
    with pytest.raises(CaptureError, match=r"messages\[0\]: a 'document' block has no Chat Completions form"):
        messages_to_chat({"model": "m", "max_tokens": 8, "messages": [document]})
    image = {"role": "user", "content": [{"type": "text", "text": "what?"}, {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}  # images have one: image_url
    assert messages_to_chat({"model": "m", "max_tokens": 8, "messages": [image]})["messages"][0]["content"] == [
        {"type": "text", "text": "what?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    with pytest.raises(CaptureError, match=r"server tools \['web_search'\]"):
        messages_to_chat({"model": "m", "max_tokens": 8, "messages": [], "tools": [
            {"type": "web_search_20250305", "name": "web_search"}]})
    with pytest.raises(CaptureError, match="turns are 'user', 'assistant' or 'system'"):
        messages_to_chat({"model": "m", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]})
    with pytest.raises(CaptureError, match="a list of"):
        messages_to_chat({"model": "m", "max_tokens": 8, "messages": "hi"})


def test_a_system_turn_inside_the_conversation_stays_in_place() -> None:
    """Claude Code sends mid-conversation system turns; they render as system messages where they are."""
    body = {"model": "m", "max_tokens": 8, "system": "S", "messages": [
        {"role": "user", "content": "q"}, {"role": "system", "content": [{"type": "text", "text": "reminder"}]}]}
    assert messages_to_chat(body)["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
                                                  {"role": "system", "content": "reminder"}]


def test_a_chat_reply_becomes_a_message_the_sdk_parses() -> None:
    reply = {"id": "chatcmpl-1", "model": "policy", "usage": {"prompt_tokens": 41, "completion_tokens": 9},
             "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                 "role": "assistant", "content": "Counting.",
                 "tool_calls": [{"id": "call_7", "type": "function",
                                 "function": {"name": "bash", "arguments": json.dumps({"cmd": "ls | wc -l"})}}]}}]}
    message = Message.model_validate(chat_to_message(reply))
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Counting."  # type: ignore[union-attr]
    tool = message.content[1]
    assert (tool.id, tool.name, tool.input) == ("call_7", "bash", {"cmd": "ls | wc -l"})  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use" and (message.usage.input_tokens, message.usage.output_tokens) == (41, 9)


@pytest.mark.parametrize(("finish", "matched", "stop_reason", "sequence"), [
    ("stop", None, "end_turn", None), ("length", None, "max_tokens", None),
    ("stop", "</done>", "stop_sequence", "</done>"), ("stop", 2, "end_turn", None),  # a stop token id: EOS-like
])
def test_stop_reasons(finish: str, matched: object, stop_reason: str, sequence: str | None) -> None:
    reply = {"choices": [{"finish_reason": finish, "stop_reason": matched, "message": {"content": "x"}}]}
    message = Message.model_validate(chat_to_message(reply, stop_sequences=["</done>"]))
    assert (message.stop_reason, message.stop_sequence) == (stop_reason, sequence)


def test_tool_arguments_that_are_not_json_are_kept_not_lost() -> None:
    reply = {"choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]}}]}
    message = Message.model_validate(chat_to_message(reply))
    assert message.content[0].input == {"_raw_arguments": "{not json"}  # type: ignore[union-attr]


def _accumulate(events: list[dict]) -> Message:
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot, bufs = None, {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump())


def test_a_chat_stream_becomes_the_messages_events_the_sdk_accumulates_to_the_same_message() -> None:
    args = json.dumps({"cmd": "ls | wc -l"})
    chunks = [
        {"id": "c1", "model": "policy", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"id": "c1", "model": "policy", "choices": [{"index": 0, "delta": {"content": "Count"}}]},
        {"id": "c1", "model": "policy", "choices": [{"index": 0, "delta": {"content": "ing."}}]},
        {"id": "c1", "model": "policy", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_7", "type": "function", "function": {"name": "bash", "arguments": args[:9]}}]}}]},
        {"id": "c1", "model": "policy", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": args[9:]}}]}}]},
        {"id": "c1", "model": "policy", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"id": "c1", "model": "policy", "choices": [], "usage": {"prompt_tokens": 41, "completion_tokens": 9}},
    ]
    stream = ChatStreamToMessages()
    events = [e for chunk in chunks for e in stream.feed(chunk)] + stream.finish()
    assert [e["type"] for e in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"]
    whole = {"id": "c1", "model": "policy", "usage": {"prompt_tokens": 41, "completion_tokens": 9},
             "choices": [{"finish_reason": "tool_calls", "message": {"content": "Counting.", "tool_calls": [
                 {"id": "call_7", "type": "function", "function": {"name": "bash", "arguments": args}}]}}]}
    streamed = _accumulate(events)
    assert streamed.model_dump() == Message.model_validate(chat_to_message(whole)).model_dump()


def test_a_stream_stopped_on_a_stop_sequence_says_which() -> None:
    stream = ChatStreamToMessages(stop_sequences=["</done>"])
    events = stream.feed({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop", "stop_reason": "</done>"}]})
    message = _accumulate(events + stream.finish())
    assert (message.stop_reason, message.stop_sequence, message.content[0].text) == (  # type: ignore[union-attr]
        "stop_sequence", "</done>", "ok")
