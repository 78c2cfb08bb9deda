"""The fake upstream's Anthropic Messages route (`POST /v1/messages`): a native Messages server, deterministic.

The reply is what the fake's chat route would answer to the request's Chat translation
(`messages_chat.messages_to_chat`): the same text or tool call, the same byte tokens and logprobs. Like rllm's
policy server it adds, only when asked by the chat names, `prompt_token_ids` / `token_ids` / `policy_version`
(`return_token_ids: true`) and `logprobs` (`logprobs: true`): on the message, and when streaming on
message_start (prompt ids) and message_delta (the rest). Streams are sent in Anthropic's event order, text
one token per delta, a tool call's input JSON in 4-token pieces, with a ping after message_start.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from rllm_rollout.capture.messages_chat import FINISH_TO_STOP, messages_to_chat
from rllm_testing.fake_tokens import _prompt_ids, decode, encode, token_logprob

__all__ = ["serve_messages"]


async def serve_messages(up: Any, request: web.Request) -> web.StreamResponse:
    """Answer one Messages request for FakeUpstream `up` (its responder, request log and policy version)."""
    body = await request.json()
    up.requests.append(body)
    up.authorizations.append(request.headers.get("Authorization") or request.headers.get("x-api-key"))
    chat = messages_to_chat(body)
    text, call, finish = up._reply_parts(chat)
    ids, prompt_ids = encode(text), _prompt_ids(chat)
    want_ids, want_lp = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
    stop = FINISH_TO_STOP.get(finish, "end_turn")
    mid = f"msg_{len(up.requests)}"
    if call is not None:
        block: dict[str, Any] = {"type": "tool_use", "id": call["id"].replace("call_", "toolu_"),
                                 "name": call["function"]["name"], "input": json.loads(text)}
    else:
        block = {"type": "text", "text": text}
    extra_start: dict[str, Any] = {"prompt_token_ids": prompt_ids, "policy_version": up.policy_version} \
        if want_ids else {}
    extra_end: dict[str, Any] = {"token_ids": ids} if want_ids else {}
    if want_lp:
        extra_end["logprobs"] = [token_logprob(t) for t in ids]
    usage = {"input_tokens": len(prompt_ids), "output_tokens": len(ids)}
    message = {"id": mid, "type": "message", "role": "assistant", "model": body.get("model") or "fake-model",
               "content": [block], "stop_reason": stop, "stop_sequence": None}
    if not body.get("stream"):
        return web.json_response({**message, "usage": usage, **extra_start, **extra_end})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(kind: str, **payload: Any) -> None:
        await resp.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode())

    await send("message_start", message={**message, "content": [], "stop_reason": None,
                                         "usage": {"input_tokens": len(prompt_ids), "output_tokens": 1},
                                         **extra_start})
    await send("ping")
    if call is not None:
        await send("content_block_start", index=0, content_block={**block, "input": {}})
        for k in range(0, len(ids), 4):
            await send("content_block_delta", index=0,
                       delta={"type": "input_json_delta", "partial_json": decode(ids[k:k + 4])})
    else:
        await send("content_block_start", index=0, content_block={"type": "text", "text": ""})
        for t in ids:
            await send("content_block_delta", index=0, delta={"type": "text_delta", "text": decode([t])})
    await send("content_block_stop", index=0)
    await send("message_delta", delta={"stop_reason": stop, "stop_sequence": None},
               usage={"output_tokens": len(ids)}, **extra_end)
    await send("message_stop")
    await resp.write_eof()
    return resp
