"""`POST /v1/messages`: the Anthropic Messages API, served by the chat path's engine, template and tool parsing.

The request is turned into the Chat request a chat template renders the same way
(`rllm_rollout.capture.messages_chat.messages_to_chat`, the translation capture also records), so a Messages
call and the chat call it corresponds to give the same prompt tokens, and `rllm_continue` (the gateway's
exact-turn hint) works here as on chat. The reply is the chat reply in Messages form (`chat_to_message`;
streamed: `ChatStreamToMessages`), text deltas live as the tokens come, a reply with tools sent once whole
(the text must be complete to be parsed into `tool_use` blocks).

rllm's additions, asked for by the chat names and absent otherwise (an Anthropic SDK never sees them unasked):
`return_token_ids: true` adds `prompt_token_ids`, `token_ids`, `token_policy_versions` and `policy_version`,
`logprobs: true` adds `logprobs` (one float per completion token, tool-call tokens included): on the message,
and when streaming `prompt_token_ids` on message_start, the rest on message_delta.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from rllm_core.errors import CaptureError
from rllm_rollout.capture.messages_chat import ChatStreamToMessages, chat_to_message, messages_to_chat
from rllm_serve.protocol import ChatRequest, RequestError
from rllm_serve.responses import ChoiceResult, ResponseBuilder
from rllm_serve.sequence import TokenEvent

__all__ = ["MessagesCall", "chat_request_for", "stream_messages"]

_CARRIED = ("rllm_continue", "seed", "chat_template_kwargs", "top_k", "logprobs", "return_token_ids")


def chat_request_for(body: Any) -> ChatRequest:
    """The ChatRequest a Messages body becomes; RequestError (400) for a body with no Chat form."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise RequestError("messages: send at least one message", param="messages")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise RequestError("max_tokens: required, an integer >= 1 (as in Anthropic's API)", param="max_tokens")
    try:
        chat = messages_to_chat(body)
    except CaptureError as exc:
        raise RequestError(str(exc), param="messages") from None
    chat.pop("stream_options", None)
    chat.update({k: body[k] for k in _CARRIED if body.get(k) is not None})
    return ChatRequest.model_validate(chat)


class MessagesCall:
    """One Messages request's reply, built from the chat path's results."""

    def __init__(self, builder: ResponseBuilder, body: dict[str, Any]) -> None:
        self.builder = builder
        self.stops = [s for s in body.get("stop_sequences") or [] if isinstance(s, str)]
        self.want_ids = bool(body.get("return_token_ids"))
        self.want_lp = bool(body.get("logprobs"))
        self.message_id = builder.id.replace("chatcmpl-", "msg_", 1)

    def ours(self, r: ChoiceResult, *, prompt: bool) -> dict[str, Any]:
        """rllm's fields for this reply, as asked (module docstring)."""
        out: dict[str, Any] = {}
        if self.want_ids:
            if prompt:
                out["prompt_token_ids"] = self.builder.prompt_ids
            out.update(token_ids=r.token_ids, token_policy_versions=r.token_versions,
                       policy_version=r.policy_version)
        if self.want_lp:
            out["logprobs"] = r.logprobs
        return out

    def message(self, r: ChoiceResult) -> dict[str, Any]:
        chat = self.builder.full([r])
        message = chat_to_message(chat, self.stops)
        message["id"] = self.message_id
        return {**message, **self.ours(r, prompt=True)}


async def stream_messages(request: web.Request, queue: asyncio.Queue[TokenEvent],
                          call: MessagesCall) -> web.StreamResponse:
    """Stream one reply as Messages events while the engine's TokenEvents arrive (module docstring)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    builder = call.builder
    to_messages = ChatStreamToMessages(call.stops, call.message_id)
    live = not builder.parse_tools
    result = ChoiceResult(0)

    async def send(events: list[dict[str, Any]]) -> None:
        for event in events:
            if event["type"] == "message_start" and call.want_ids:
                event["message"]["prompt_token_ids"] = builder.prompt_ids
            if event["type"] == "message_delta":
                event.update(call.ours(result, prompt=False))
            if event["type"] == "message_start":
                event["message"]["usage"]["input_tokens"] = len(builder.prompt_ids)
            await resp.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())

    base = {"id": call.message_id, "model": builder.model}
    await send(to_messages.feed({**base, "choices": []}))
    while result.finish_reason is None:
        ev = await queue.get()
        result.add(ev)
        if live and ev.text and result.finish_reason not in ("error", "abort"):
            await send(to_messages.feed({**base, "choices": [{"index": 0, "delta": {"content": ev.text}}]}))
    if result.finish_reason in ("error", "abort"):
        error = {"type": "error", "error": {"type": "api_error", "message": f"generation failed: {result.error}"}}
        await resp.write(f"event: error\ndata: {json.dumps(error)}\n\n".encode())
        await resp.write_eof()
        return resp
    choice = builder.full([result])["choices"][0]
    if not live:
        message = choice["message"]
        await send(to_messages.feed({**base, "choices": [{"index": 0, "delta": {
            "content": message.get("content"),
            "tool_calls": [{**c, "index": k} for k, c in enumerate(message.get("tool_calls") or [])]}}]}))
    await send(to_messages.feed({**base, "choices": [{"index": 0, "delta": {},
                                                      "finish_reason": choice["finish_reason"]}],
                                 "usage": builder.usage(len(result.token_ids))}))
    await send(to_messages.finish())
    await resp.write_eof()
    return resp
