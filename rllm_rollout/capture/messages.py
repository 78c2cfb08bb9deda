"""The Anthropic Messages API (`POST .../messages`) captured like a chat call, both ways it can be served.

`MessagesAssembler`: the upstream speaks Messages itself (rllm's policy server, Anthropic, a vLLM with its
Anthropic route). The reply is a message object or a stream of typed events (message_start,
content_block_start / _delta / _stop, message_delta, message_stop, ping, error); the Step is recorded when
message_stop is seen, before the client gets it. Token ids and logprobs are rllm's additions, asked for by the
chat names (`return_token_ids`, `logprobs`) on loopback upstreams: `prompt_token_ids` on the message (in
message_start when streaming), `token_ids` / `logprobs` / `token_policy_versions` on the message (on
message_delta when streaming). An upstream that sends none (Anthropic) gives a Step without ids: untrainable
unless a tokenizer retokenizes it, and counted as such like any other.

`MessagesViaChatAssembler`: the upstream speaks only Chat Completions (vLLM, any OpenAI-compatible server).
The gateway sent it the Chat translation (`request.prepare_messages_via_chat`); this assembler captures that
Chat reply exactly as a chat call is captured (ids, logprobs, tool calls) and hands the client the Messages
reply instead (`messages_chat.chat_to_message`, or the event stream of `ChatStreamToMessages`).

Either way the Step is chat-shaped, so packing, exact turns and retokenizing treat it like any chat call:
`endpoint="messages"`, `messages` the Chat form of system + messages, `tool_calls` chat tool calls, and the
request's and reply's thinking blocks in `metadata["thinking"]`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rllm_core.types import Step, TokenSource
from rllm_rollout.capture import _json
from rllm_rollout.capture.assemble import CallAssembler, error_step, request_messages
from rllm_rollout.capture.choices import Choice
from rllm_rollout.capture.messages_chat import ChatStreamToMessages, chat_to_message, thinking_blocks
from rllm_rollout.capture.request import CallRequest
from rllm_rollout.capture.responses import usage_with_chat_names
from rllm_rollout.capture.retokenize import retokenize_step
from rllm_rollout.capture.sse import data_of, event_lines

__all__ = ["STOP_TO_FINISH", "MessagesAssembler", "MessagesViaChatAssembler", "anthropic_error", "sse_event"]

STOP_TO_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                  "refusal": "content_filter", "pause_turn": "stop", "model_context_window_exceeded": "length"}
"""Messages' `stop_reason` → the chat `finish_reason` a Step keeps (packing reads it the same for every API)."""

_IDS = ("prompt_token_ids", "token_ids", "token_policy_versions", "policy_version")


def sse_event(event: dict[str, Any]) -> bytes:
    """One Messages SSE event: `event: <type>` then its JSON data, as Anthropic sends them."""
    return b"event: " + str(event.get("type")).encode() + b"\ndata: " + _json.dumps(event) + b"\n\n"


def anthropic_error(message: str, kind: str = "api_error") -> dict[str, Any]:
    """An Anthropic-shaped error body (the SDK raises it with this message)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _metadata(call: CallRequest, source: dict[str, Any], reply_thinking: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"api": "messages"}
    thinking = thinking_blocks(source) + reply_thinking
    if thinking:
        out["thinking"] = thinking
    if call.source is not None:
        out["translated"] = "messages->chat"
    return out


# ---------------------------------------------------------------------------------- a Chat-only upstream
class MessagesViaChatAssembler(CallAssembler):
    """Capture the Chat reply to a translated Messages call; give the client the Messages reply (docstring)."""

    def __init__(self, call: CallRequest, *, sse: bool, tokenizer: Any = None) -> None:
        super().__init__(call, sse=sse, tokenizer=tokenizer)
        source = call.source or {}
        stops = [s for s in _list(source.get("stop_sequences")) if isinstance(s, str)]
        self._stops = stops
        self._to_messages = ChatStreamToMessages(stops)
        self._pending: list[dict[str, Any]] = []
        self._body: dict[str, Any] | None = None
        self._ended = False

    def _absorb_chunk(self, chunk: dict[str, Any]) -> None:
        super()._absorb_chunk(chunk)
        if chunk.get("error") and not chunk.get("choices"):
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self._pending.append(anthropic_error(f"upstream error mid-stream: {msg}"))
            self._ended = True
            return
        if not self._ended:
            self._pending += self._to_messages.feed(chunk)

    def _absorb_body(self, body: dict[str, Any]) -> None:
        super()._absorb_body(body)
        self._body = body

    def _strip(self, obj: dict[str, Any]) -> None:
        """Nothing to strip: the client never sees the Chat bytes."""

    def _on_event(self, event: bytes) -> bytes:
        super()._on_event(event)
        payload = data_of(event_lines(event))
        if payload is not None and payload.strip() == b"[DONE]" and not self._ended:
            self._pending += self._to_messages.finish()
            self._ended = True
        out = b"".join(sse_event(e) for e in self._pending)
        self._pending.clear()
        return out

    def _finish_bytes(self) -> bytes:
        if self.sse:
            if not self._framing_broken:
                self._drain(final=True)  # the last events, translated into `_out`
            out = bytes(self._out)
            self._out.clear()
            self._in.take()  # an unterminated Chat event: never shown to a Messages client
            if not self._ended:  # the Chat stream ended without [DONE]: the client must not wait for message_stop
                self._pending.append(anthropic_error("the upstream's stream ended before it finished"))
                self._ended = True
            out += b"".join(sse_event(e) for e in self._pending)
            self._pending.clear()
            return out
        super()._finish_bytes()
        if self._body is None:
            return _json.dumps(anthropic_error(self._parse_error or "the upstream's reply was not a chat completion"))
        return _json.dumps(chat_to_message(self._body, self._stops))

    def _steps(self, error: str | None) -> list[Step]:
        meta = _metadata(self.call, self.call.source or {}, [])
        return [s.model_copy(update={"endpoint": "messages", "metadata": {**s.metadata, **meta}})
                for s in super()._steps(error)]


# ---------------------------------------------------------------------------------- a Messages upstream
class MessagesAssembler(CallAssembler):
    """Parse one Messages reply (JSON or SSE) into one Step; see the module docstring."""

    def __init__(self, call: CallRequest, *, sse: bool, tokenizer: Any = None) -> None:
        super().__init__(call, sse=sse, tokenizer=tokenizer)
        self._message: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._parts: dict[int, list[str]] = {}
        self._stop: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}
        self._ids: dict[str, Any] = {}
        self._failure: str | None = None

    def _is_final_event(self, payload: bytes) -> bool:
        if b"message_stop" not in payload:
            return False
        try:
            event = _json.loads(payload)
        except ValueError:
            return False
        return isinstance(event, dict) and event.get("type") == "message_stop"

    def _take_ids(self, obj: dict[str, Any]) -> None:
        for key in (*_IDS, "logprobs"):
            if obj.get(key) is not None:
                self._ids[key] = obj[key]

    def _absorb_chunk(self, chunk: dict[str, Any]) -> None:
        kind = chunk.get("type")
        index = chunk.get("index") if isinstance(chunk.get("index"), int) else 0
        if kind == "message_start" and isinstance(chunk.get("message"), dict):
            self._message = dict(chunk["message"])
            self._usage.update(chunk["message"].get("usage") or {})
            self._take_ids(chunk["message"])
        elif kind == "content_block_start" and isinstance(chunk.get("content_block"), dict):
            self._blocks[index] = dict(chunk["content_block"])
        elif kind == "content_block_delta" and isinstance(chunk.get("delta"), dict):
            delta = chunk["delta"]
            piece = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking",
                     "signature_delta": "signature"}.get(str(delta.get("type")))
            if piece == "signature":
                self._blocks.setdefault(index, {"type": "thinking"})["signature"] = delta.get("signature")
            elif piece is not None:
                self._parts.setdefault(index, []).append(str(delta.get(piece) or ""))
        elif kind == "message_delta":
            if isinstance(chunk.get("delta"), dict):
                self._stop.update(chunk["delta"])
            if isinstance(chunk.get("usage"), dict):
                self._usage.update({k: v for k, v in chunk["usage"].items() if v is not None})
            self._take_ids(chunk)
        elif kind == "error":
            err = chunk.get("error")
            msg = err.get("message", err) if isinstance(err, dict) else err
            self._failure = f"upstream error mid-stream: {msg}"

    def _absorb_body(self, body: dict[str, Any]) -> None:
        if body.get("type") == "error":
            err = body.get("error")
            self._failure = f"upstream error: {err.get('message', err) if isinstance(err, dict) else err}"
            return
        self._message = dict(body)
        self._blocks = {i: b for i, b in enumerate(_list(body.get("content"))) if isinstance(b, dict)}
        self._stop = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
        self._usage = dict(body.get("usage") or {})
        self._take_ids(body)

    def _strip(self, obj: dict[str, Any]) -> None:
        """Remove what we asked for on the client's behalf: from the message (body, message_start) and from
        message_delta."""
        for target in (obj, obj.get("message")):
            if not isinstance(target, dict):
                continue
            if not self.call.wants_token_ids:
                for key in _IDS:
                    target.pop(key, None)
            if not self.call.wants_logprobs:
                target.pop("logprobs", None)

    def _content(self) -> list[dict[str, Any]]:
        """The reply's content blocks, their streamed pieces joined (a tool_use's input parsed from its JSON)."""
        blocks = []
        for i in sorted(set(self._blocks) | set(self._parts)):
            block = dict(self._blocks.get(i) or {"type": "text"})
            pieces = "".join(self._parts.get(i, []))
            if block.get("type") == "text" and i in self._parts:
                block["text"] = str(block.get("text") or "") + pieces
            elif block.get("type") == "thinking" and i in self._parts:
                block["thinking"] = str(block.get("thinking") or "") + pieces
            elif block.get("type") == "tool_use" and i in self._parts:
                try:
                    block["input"] = json.loads(pieces) if pieces.strip() else {}
                except json.JSONDecodeError:
                    block["input"] = {"_raw_arguments": pieces}  # the model wrote no JSON: kept, not lost
            blocks.append(block)
        return blocks

    def _steps(self, error: str | None) -> list[Step]:
        error = error or self._failure
        if self.sse and not self.done and error is None and (self._message or self._blocks):
            error = "stream ended before message_stop"
        if not self._message and not self._blocks:
            return [error_step(self.call, error or "upstream response had no message")]
        return [self._message_step(error)]

    def _message_step(self, error: str | None) -> Step:
        call, body = self.call, self.call.body
        text: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        thinking: list[dict[str, Any]] = []
        other: list[dict[str, Any]] = []
        for block in self._content():
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text") or ""))
            elif kind == "tool_use":
                tool_calls.append({"id": block.get("id"), "type": "function", "function": {
                    "name": block.get("name") or "", "arguments": json.dumps(block.get("input") or {})}})
            elif kind in ("thinking", "redacted_thinking"):
                thinking.append(block)
            else:
                other.append(block)
        metadata = {"upstream": call.upstream, "response_id": self._message.get("id"),
                    **_metadata(call, body, thinking)}
        if other:
            metadata["other_content"] = other
        stop = self._stop.get("stop_reason")
        if self._stop.get("stop_sequence"):
            metadata["stop_sequence"] = self._stop["stop_sequence"]
        ids, lps, prompt_ids = self._tokens(metadata)
        source: TokenSource = "server" if prompt_ids is not None and ids is not None else "none"
        versions = [int(v) for v in self._ids["token_policy_versions"]] if source == "server" and isinstance(
            self._ids.get("token_policy_versions"), list) and len(self._ids["token_policy_versions"]) == len(
            ids or []) else None
        params = call.params
        if params.get("tools"):
            params = {**params, "tools": _chat_tools(params["tools"])}
        step = Step(
            agent=call.agent, endpoint="messages", model=body.get("model") or self._message.get("model"),
            messages=request_messages(call), params=params, prompt_token_ids=prompt_ids,
            completion_token_ids=ids, logprobs=lps, text="".join(text) if text else (None if tool_calls else ""),
            tool_calls=tool_calls or None, finish_reason=STOP_TO_FINISH.get(str(stop), stop) if stop else None,
            usage=usage_with_chat_names(self._usage), latency_s=time.perf_counter() - call.t0,
            started_at=call.started_at, policy_version=_int_or_none(self._ids.get("policy_version")),
            token_policy_versions=versions, token_source=source, error=error, metadata=metadata,
        )
        return retokenize_step(step, self.tokenizer)

    def _tokens(self, metadata: dict[str, Any]) -> tuple[list[int] | None, list[float] | None, list[int] | None]:
        """(completion ids, their logprobs when one per id, prompt ids), through `Choice`'s checks."""
        c = Choice()
        raw_ids, raw_lps = self._ids.get("token_ids"), self._ids.get("logprobs")
        lps = [v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in _list(raw_lps)] \
            if isinstance(raw_lps, list) else None
        c.add_tokens(raw_ids if isinstance(raw_ids, list) else None, lps, None, "the message",
                     self._logprobs_requested() and raw_ids is not None)
        prompt = self._ids.get("prompt_token_ids")
        try:
            prompt_ids = [int(t) for t in prompt] if isinstance(prompt, list) else None
        except (TypeError, ValueError, OverflowError):
            prompt_ids = None
        return c.token_ids, self._trainable_logprobs(c, metadata), prompt_ids


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Messages tools as the chat tools a template renders (server tools, which have no schema, left out)."""
    return [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                              "parameters": t.get("input_schema")}}
            for t in _list(tools) if isinstance(t, dict) and "input_schema" in t]

