"""One intercepted LLM request: what the client asked for, and the body actually sent upstream.

Both transports (gateway, in-process) call `prepare_call` on the raw request body. It records what the client
asked for (so the fields we add can be stripped from what it gets back) and, for upstreams that support it,
asks for `logprobs` and `return_token_ids` so every Step carries the server's own ids.

The Responses API (`POST .../responses`) asks in vLLM's own Responses fields instead (vLLM's `ResponsesRequest`
has no `return_token_ids`): `include: ["message.output_text.logprobs"]` (with `top_logprobs: 0` when unset, the
sampled token's logprob only) for logprobs, and `enable_response_messages: true` for token ids, which makes vLLM
(and rllm's policy server) return `input_messages` / `output_messages` as `{"type": "raw_message_tokens",
"message": ..., "tokens": [...]}`: the prompt's and the completion's ids.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from rllm_core.errors import CaptureError
from rllm_rollout.capture import _json
from rllm_rollout.capture.messages_chat import messages_to_chat

__all__ = ["LOGPROBS_INCLUDE", "CallRequest", "Endpoint", "endpoint_of", "is_loopback", "prepare_call",
           "prepare_messages_via_chat"]

Endpoint = Literal["chat", "completions", "responses", "messages"]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The Responses API's `include` entry that asks for output-text logprobs (OpenAI's and vLLM's name)."""

_NOT_PARAMS = frozenset({"messages", "prompt", "model"})
_NOT_RESPONSES_PARAMS = frozenset({"input", "instructions", "model"})
_NOT_MESSAGES_PARAMS = frozenset({"messages", "system", "model"})


@dataclass(slots=True)
class CallRequest:
    """The request half of one captured call."""

    endpoint: Endpoint
    body: dict[str, Any]
    """The body as the client sent it (before injection)."""
    upstream: str
    agent: str | None = None
    source: dict[str, Any] | None = None
    """A Messages call sent to a Chat-only upstream: the client's Messages body (`body` is then its Chat
    translation, what the upstream rendered and the Step records)."""
    wants_logprobs: bool = True
    wants_token_ids: bool = True
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def strips(self) -> bool:
        """True when the response must be rewritten before the client sees it."""
        return self.source is not None or not (self.wants_logprobs and self.wants_token_ids)

    @property
    def params(self) -> dict[str, Any]:
        """Sampling parameters: the body less what becomes the Step's prompt (messages / prompt / input)."""
        if self.endpoint == "messages" and self.source is None:
            skip = _NOT_MESSAGES_PARAMS
        else:
            skip = _NOT_RESPONSES_PARAMS if self.endpoint == "responses" else _NOT_PARAMS
        return {k: v for k, v in self.body.items() if k not in skip}


def endpoint_of(path: str) -> Endpoint | None:
    """`chat` for .../chat/completions, `completions` for .../completions, `responses` for .../responses,
    `messages` for .../messages (Anthropic; `.../messages/count_tokens` and `.../messages/batches` are not one).

    Only the generating POST of the Responses API is one: `.../responses/{id}` (retrieve, delete),
    `.../responses/{id}/cancel` and `.../input_items` return stored objects, not a new generation (None).
    """
    path = "/" + path.split("?", 1)[0].strip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/messages"):
        return "messages"
    return None


def is_loopback(url: str) -> bool:
    """True for upstreams on this machine (our policy server, a local vLLM): they accept vLLM fields."""
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _asked(value: Any) -> bool:
    return value is not None and value is not False


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = _json.loads(raw) if raw else None
    except ValueError as exc:
        raise CaptureError(f"request body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise CaptureError(
            f"request body must be a JSON object, got {type(body).__name__}; send e.g. "
            '{"model": ..., "messages": [...]}'
        )
    return body


def prepare_call(
    raw: bytes, endpoint: Endpoint, *, upstream: str, inject: bool, agent: str | None = None
) -> tuple[CallRequest, bytes]:
    """Parse a request body; return the call record and the bytes to send upstream.

    A Messages call (`endpoint="messages"`) sent as it is asks a loopback upstream for our fields by the chat
    names (`logprobs`, `return_token_ids`: rllm's policy server answers them on `/v1/messages` too).
    Raises CaptureError (with what to fix) when the body is not a JSON object.
    """
    body = _body(raw)
    call = CallRequest(endpoint=endpoint, body=body, upstream=upstream, agent=agent)
    if not inject:
        return call, raw
    if endpoint == "responses":
        return _prepare_responses(call, raw)
    call.wants_logprobs = _asked(body.get("logprobs"))
    call.wants_token_ids = _asked(body.get("return_token_ids"))
    if not call.strips:
        return call, raw
    sent = dict(body)
    if not call.wants_logprobs:
        # `true` on /completions too: vLLM's int field reads it as 1, our policy server as "sampled token only".
        sent["logprobs"] = True
    if not call.wants_token_ids:
        sent["return_token_ids"] = True
    return call, _json.dumps(sent)


def prepare_messages_via_chat(
    raw: bytes, *, upstream: str, inject: bool, agent: str | None = None
) -> tuple[CallRequest, bytes]:
    """A Messages call for an upstream that speaks only Chat Completions: the call (its `body` the Chat
    translation, `source` the Messages body) and the Chat request to send, asking for ids and logprobs when
    `inject`. Raises CaptureError for a body that is not JSON or has no Chat form (images, server tools)."""
    source = _body(raw)
    chat = messages_to_chat(source)
    call = CallRequest(endpoint="messages", body=chat, upstream=upstream, agent=agent, source=source)
    if inject:
        call.wants_logprobs = call.wants_token_ids = False
        chat = {**chat, "logprobs": True, "return_token_ids": True}
    return call, _json.dumps(chat)


def _prepare_responses(call: CallRequest, raw: bytes) -> tuple[CallRequest, bytes]:
    """Ask a Responses upstream for logprobs and token ids in vLLM's Responses fields (module docstring)."""
    body = call.body
    include = body.get("include")
    include = include if isinstance(include, list) else []
    call.wants_logprobs = LOGPROBS_INCLUDE in include
    call.wants_token_ids = _asked(body.get("enable_response_messages"))
    if body.get("background"):  # vLLM returns raw messages only for foreground requests: ask for nothing
        call.wants_logprobs = call.wants_token_ids = True
    if not call.strips:
        return call, raw
    sent = dict(body)
    if not call.wants_logprobs:
        sent["include"] = [*include, LOGPROBS_INCLUDE]
        if sent.get("top_logprobs") is None:  # vLLM: null means no logprobs even when included; 0 = sampled only
            sent["top_logprobs"] = 0
    if not call.wants_token_ids:
        sent["enable_response_messages"] = True
    return call, _json.dumps(sent)
