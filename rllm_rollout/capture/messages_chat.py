"""Anthropic Messages ↔ OpenAI Chat Completions, both ways, for upstreams that speak only Chat (issue 29, part 2).

A Messages request (`POST /v1/messages`: `system`, `messages` of content blocks, `tools`, `tool_choice`,
`stop_sequences`, `max_tokens`) becomes the Chat request a chat template renders the same way: the system prompt
first, `text` blocks joined, an assistant's `tool_use` blocks as `tool_calls`, a user's `tool_result` blocks as
`tool` messages placed before the rest of that turn. A Chat reply becomes the Messages reply an Anthropic SDK
parses: `text` and `tool_use` blocks, `stop_reason` from `finish_reason`, usage from usage; a Chat stream becomes
the Messages event stream (`ChatStreamToMessages`) that the SDK accumulates to that same message. Token ids and logprobs
that a Chat upstream returns (vLLM's `prompt_token_ids`, `logprobs`) are not part of the Messages shape: they
travel beside it, and capture keeps them on the Step.

Thinking blocks (`thinking`, `redacted_thinking`) have no Chat form: a request's are dropped from what is rendered
and kept by the caller in the Step's metadata, as the issue asks. Not translated (refused by name, never
silently dropped): document blocks, server tools (they run on Anthropic's side). A user's `image` blocks become
Chat `image_url` parts (a base64 source as a data URL, a url source as its URL), in place among its text.

The gateway's `/v1/messages` route for Chat-only upstreams (capture/messages.py) and the policy server's native
`/v1/messages` (rllm_serve/messages_api.py) are built on this module.
"""

from __future__ import annotations

import json
from typing import Any

from rllm_core.errors import CaptureError

__all__ = ["FINISH_TO_STOP", "ChatStreamToMessages", "chat_to_message", "messages_to_chat", "thinking_blocks"]

FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                  "content_filter": "refusal", "function_call": "tool_use"}
"""Chat's `finish_reason` → Messages' `stop_reason` (a stop on one of `stop_sequences` → "stop_sequence")."""

_THINKING = ("thinking", "redacted_thinking")


def _text(content: Any, where: str) -> str:
    """The text of a string or of a list of `text` blocks (thinking blocks skipped); other blocks refused."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(str(block.get("text") or ""))
        elif kind not in _THINKING:
            raise CaptureError(f"{where}: a {kind!r} block has no Chat Completions form; send text, tool_use and "
                               "tool_result blocks to an upstream that speaks only Chat")
    return "".join(parts)


def thinking_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's thinking blocks, in order (kept on the Step's metadata; a template never renders them)."""
    return [block for m in body.get("messages") or [] if isinstance(m.get("content"), list)
            for block in m["content"] if isinstance(block, dict) and block.get("type") in _THINKING]


def _user_turn(content: Any, index: int) -> list[dict[str, Any]]:
    """One user turn: its tool results as `tool` messages first (they answer the previous assistant turn's calls,
    as chat templates expect), then its text, if any."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            result = block.get("content")
            text = _text(result, f"messages[{index}].tool_result") if result is not None else ""
            if block.get("is_error"):
                text = f"Error: {text}"
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        else:
            rest.append(block)
    if any(isinstance(b, dict) and b.get("type") == "image" for b in rest):
        out.append({"role": "user", "content": [_image_part(b) if b.get("type") == "image" else
                                                {"type": "text", "text": _text([b], f"messages[{index}]")}
                                                for b in rest if isinstance(b, dict) and b.get("type") not in
                                                _THINKING]})
    elif rest:
        out.append({"role": "user", "content": _text(rest, f"messages[{index}]")})
    return out


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic `image` block as the Chat `image_url` part it is."""
    src = block.get("source") or {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type') or 'image/png'};base64,{src.get('data') or ''}"
    else:
        url = str(src.get("url") or "")
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant_turn(content: Any, index: int) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    calls = [{"id": b.get("id"), "type": "function",
              "function": {"name": b.get("name") or "", "arguments": json.dumps(b.get("input") or {})}}
             for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    text = _text([b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_use")],
                 f"messages[{index}]")
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in (None, "auto"):
        return "auto"
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind == "none":
        return "none"
    raise CaptureError(f"tool_choice {choice!r} has no Chat Completions form")


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions request for a Messages request `body` (model, sampling and stream carried over)."""
    turns = body.get("messages")
    if not isinstance(turns, list) or not all(isinstance(m, dict) for m in turns):
        raise CaptureError("messages must be a list of {role, content} objects")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(turns):
        role = m.get("role")
        if role == "user":
            messages.extend(_user_turn(m.get("content"), i))
        elif role == "assistant":
            messages.append(_assistant_turn(m.get("content"), i))
        elif role == "system":  # a system turn inside the conversation (Claude Code sends them): kept in place
            messages.append({"role": "system", "content": _text(m.get("content"), f"messages[{i}]")})
        else:
            raise CaptureError(f"messages[{i}].role {role!r}: Messages turns are 'user', 'assistant' or 'system'")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "max_tokens": body.get("max_tokens")}
    for key in ("temperature", "top_p", "stream"):
        if key in body:
            chat[key] = body[key]
    if body.get("top_k") is not None:
        chat["top_k"] = body["top_k"]  # vLLM's extension; an upstream without it ignores or refuses it loudly
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    server = [t.get("name") or t.get("type") for t in tools if "input_schema" not in t]
    if server:
        raise CaptureError(f"server tools {server} run on Anthropic's side and have no Chat Completions form")
    if tools:
        chat["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                           "parameters": t["input_schema"]}} for t in tools]
        if "tool_choice" in body:
            chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}  # message_delta carries the output token count
    return chat


def chat_to_message(reply: dict[str, Any], stop_sequences: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The Messages reply for a (non-streamed) Chat Completions `reply` to `messages_to_chat`'s request."""
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = {"_raw_arguments": fn.get("arguments")}  # the model wrote no JSON: kept, not lost
        content.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name") or "",
                        "input": arguments if isinstance(arguments, dict) else {"value": arguments}})
    finish = choice.get("finish_reason")
    stop_reason, stop_sequence = FINISH_TO_STOP.get(finish or "stop", "end_turn"), None
    matched = choice.get("stop_reason")  # vLLM: the stop string that ended the reply
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        stop_reason, stop_sequence = "stop_sequence", matched
    usage = reply.get("usage") or {}
    return {"id": reply.get("id") or "msg_rllm", "type": "message", "role": "assistant",
            "model": reply.get("model") or "", "content": content, "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {"input_tokens": int(usage.get("prompt_tokens") or 0),
                      "output_tokens": int(usage.get("completion_tokens") or 0)}}


class ChatStreamToMessages:
    """Chat Completions stream chunks in, Messages SSE events out (each a dict: its `type` is the event name).

    `feed(chunk)` for each parsed `data:` chunk, then `finish()`: the events a Messages client expects —
    message_start, then per content block content_block_start / _delta / _stop (text, then each tool call as a
    `tool_use` block with `input_json_delta`s), message_delta (stop reason, output tokens), message_stop. Chat
    sends usage last (`stream_options.include_usage`), so message_start reports 0 input tokens and the final
    message_delta carries both counts."""

    def __init__(self, stop_sequences: list[str] | tuple[str, ...] = (), message_id: str = "msg_rllm") -> None:
        self.stop_sequences = tuple(stop_sequences)
        self.message_id = message_id
        self._started = False
        self._open: tuple[str, int] | None = None  # ("text", -1) or ("tool", chat tool-call index)
        self._index = -1  # the Messages content-block index
        self._finish: str | None = None
        self._matched: Any = None
        self._usage: dict[str, Any] = {}

    def _start(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if self._started:
            return []
        self._started = True
        return [{"type": "message_start", "message": {
            "id": chunk.get("id") or self.message_id, "type": "message", "role": "assistant",
            "model": chunk.get("model") or "", "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}]

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _open_block(self, key: tuple[str, int], block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self._index += 1
        self._open = key
        return [*events, {"type": "content_block_start", "index": self._index, "content_block": block}]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._start(chunk)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self._open != ("text", -1):
                    events += self._open_block(("text", -1), {"type": "text", "text": ""})
                events.append({"type": "content_block_delta", "index": self._index,
                               "delta": {"type": "text_delta", "text": delta["content"]}})
            for call in delta.get("tool_calls") or []:
                key = ("tool", int(call.get("index", 0)))
                fn = call.get("function") or {}
                if self._open != key:
                    events += self._open_block(key, {"type": "tool_use", "id": call.get("id") or f"toolu_{key[1]}",
                                                     "name": fn.get("name") or "", "input": {}})
                if fn.get("arguments"):
                    events.append({"type": "content_block_delta", "index": self._index,
                                   "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
        return events

    def finish(self) -> list[dict[str, Any]]:
        events = self._start({}) + self._close()
        stop_reason, stop_sequence = FINISH_TO_STOP.get(self._finish or "stop", "end_turn"), None
        if self._finish == "stop" and isinstance(self._matched, str) and self._matched in self.stop_sequences:
            stop_reason, stop_sequence = "stop_sequence", self._matched
        return [*events,
                {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                 "usage": {"input_tokens": int(self._usage.get("prompt_tokens") or 0),
                           "output_tokens": int(self._usage.get("completion_tokens") or 0)}},
                {"type": "message_stop"}]
