"""A small deterministic OpenAI-compatible upstream in vLLM's shape, for tests and benchmarks.

Tokens are UTF-8 bytes offset by 3 (so ids are exact and checkable), logprobs a fixed function of the id,
and the reply text comes from a `responder` the test chooses. It returns `prompt_token_ids` and per-choice
`token_ids` only when asked (`return_token_ids: true`) and logprobs only when asked, like vLLM. `/v1/responses`
answers in vLLM's Responses shape (`responses_api.py`): logprobs with `include: ["message.output_text.logprobs"]`,
token ids as `input_messages` / `output_messages` with `enable_response_messages: true`; `/v1/messages` in
Anthropic's (`fake_messages.py`). It serves
on 127.0.0.1 on a free port from a background thread and records every request body (and Authorization
header) it received.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from rllm_core.threaded_app import ThreadedApp
from rllm_testing.fake_messages import serve_messages
from rllm_testing.fake_tokens import _prompt_ids, _token_str, decode, encode, token_logprob

__all__ = ["FakeUpstream", "decode", "default_responder", "encode", "start_fake_upstream", "token_logprob"]

Reply = str | dict[str, Any]
"""A reply is text, or {"tool_call": {"name": ..., "arguments": {...}}}."""


def default_responder(body: dict[str, Any]) -> Reply:
    """Call the first tool once if tools are offered and none has answered yet; else echo the last message."""
    messages = body.get("messages") or []
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        fn = body["tools"][0]["function"]
        return {"tool_call": {"name": fn["name"], "arguments": {"x": 1}}}
    if messages:
        last = messages[-1].get("content") or ""
        if isinstance(last, list):
            last = " ".join(p.get("text", "") for p in last if isinstance(p, dict))
    else:
        prompt = body.get("prompt", "")
        last = decode(prompt) if isinstance(prompt, list) else str(prompt)
    return f"ok: {str(last)[:24]}"


@dataclass
class FakeUpstream:
    responder: Callable[[dict[str, Any]], Reply] = default_responder
    delay_s: float = 0.0
    policy_version: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    """The `Authorization` header of each request, in order (to check which key reached the upstream)."""
    url: str = ""
    _stop: Callable[[], None] | None = None

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def _reply_parts(self, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str]:
        reply = self.responder(body)
        if isinstance(reply, dict) and "tool_call" in reply:
            tc = reply["tool_call"]
            args = json.dumps(tc.get("arguments", {}))
            call = {"id": f"call_{len(self.requests)}", "type": "function",
                    "function": {"name": tc["name"], "arguments": args}}
            return args, call, "tool_calls"
        text = str(reply)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if max_tokens is not None and len(encode(text)) > max_tokens:
            return decode(encode(text)[:max_tokens]), None, "length"
        return text, None, "stop"

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/responses`: the responder sees the request as chat (messages, nested tools, max_tokens)."""
        from rllm_rollout.capture.responses_input import chat_tools, input_to_messages

        body = await request.json()
        self.requests.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        chat_view = {**body, "messages": input_to_messages(body), "tools": chat_tools(body.get("tools")),
                     "max_tokens": body.get("max_output_tokens")}
        text, call, finish = self._reply_parts(chat_view)
        n = len(self.requests)
        ids, prompt_ids = encode(text), _prompt_ids(body)
        want_lp = "message.output_text.logprobs" in (body.get("include") or [])
        want_ids = bool(body.get("enable_response_messages"))
        entries = [self._lp_entry(t) for t in ids] if want_lp else []
        if call:
            item: dict[str, Any] = {"type": "function_call", "id": f"fc_{n}", "call_id": call["id"],
                                    "name": call["function"]["name"], "arguments": text, "status": "completed"}
        else:
            item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": [],
                                 "logprobs": entries if want_lp else None}]}
        full: dict[str, Any] = {
            "id": f"resp_{n}", "object": "response", "created_at": int(time.time()),
            "model": body.get("model", "fake-model"), "status": "incomplete" if finish == "length" else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
            "instructions": body.get("instructions"), "output": [item], "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
            "top_logprobs": body.get("top_logprobs") if want_lp else None, "error": None,
            "usage": {"input_tokens": len(prompt_ids), "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": len(ids), "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": len(prompt_ids) + len(ids)},
            "policy_version": self.policy_version,
            "input_messages": [{"type": "raw_message_tokens", "message": "", "tokens": prompt_ids}] if want_ids
            else None,
            "output_messages": [{"type": "raw_message_tokens", "message": text, "tokens": ids,
                                 **({"logprobs": [token_logprob(t) for t in ids]} if want_lp else {})}]
            if want_ids else None,
        }
        if not body.get("stream"):
            return web.json_response(full)
        return await self._responses_stream(request, full, item, ids, want_lp)

    async def _responses_stream(self, request: web.Request, full: dict[str, Any], item: dict[str, Any],
                                ids: list[int], want_lp: bool) -> web.StreamResponse:
        """The OpenAI event sequence, named (`event:` lines) like vLLM's; no `[DONE]`: it ends at completed."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        seq = 0

        async def send(kind: str, **payload: Any) -> None:
            nonlocal seq
            data = json.dumps({"type": kind, "sequence_number": seq, **payload})
            seq += 1
            await resp.write(f"event: {kind}\ndata: {data}\n\n".encode())

        start = {**full, "status": "in_progress", "output": [], "usage": None, "input_messages": None,
                 "output_messages": None, "incomplete_details": None}
        await send("response.created", response=start)
        await send("response.in_progress", response=start)
        if item["type"] == "function_call":
            await send("response.output_item.added", output_index=0, item={**item, "arguments": "",
                                                                          "status": "in_progress"})
            for k in range(0, len(ids), 4):  # argument fragments, merged by the receiver
                await send("response.function_call_arguments.delta", item_id=item["id"], output_index=0,
                           delta=decode(ids[k:k + 4]))
            await send("response.function_call_arguments.done", item_id=item["id"], output_index=0,
                       arguments=item["arguments"])
        else:
            part = item["content"][0]
            await send("response.output_item.added", output_index=0, item={**item, "status": "in_progress",
                                                                          "content": []})
            empty = {**part, "text": "", "logprobs": [] if want_lp else None}
            await send("response.content_part.added", item_id=item["id"], output_index=0, content_index=0,
                       part=empty)
            for t in ids:
                await send("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0,
                           delta=decode([t]), logprobs=[self._lp_entry(t)] if want_lp else [])
            await send("response.output_text.done", item_id=item["id"], output_index=0, content_index=0,
                       text=part["text"], logprobs=part["logprobs"] or [])
            await send("response.content_part.done", item_id=item["id"], output_index=0, content_index=0,
                       part=part)
        await send("response.output_item.done", output_index=0, item=item)
        await send(f"response.{full['status']}", response=full)
        await resp.write_eof()
        return resp

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await serve_messages(self, request)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        n = int(body.get("n") or 1)
        text, call, finish = self._reply_parts(body)
        ids = encode(text)
        want_ids = bool(body.get("return_token_ids"))
        want_lp = bool(body.get("logprobs"))
        prompt_ids = _prompt_ids(body)
        rid = f"cmpl-{len(self.requests)}"
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids) * n,
                 "total_tokens": len(prompt_ids) + len(ids) * n}
        if body.get("stream"):
            return await self._stream(request, body, chat, n, text, call, finish, ids, prompt_ids, rid, usage)
        choices = []
        for i in range(n):
            ch: dict[str, Any] = {"index": i, "finish_reason": finish}
            if chat:
                msg: dict[str, Any] = {"role": "assistant", "content": None if call else text}
                if call:
                    msg["tool_calls"] = [call]
                ch["message"] = msg
                if want_lp:
                    ch["logprobs"] = {"content": [self._lp_entry(t) for t in ids]}
            else:
                ch["text"] = text
                if want_lp:
                    ch["logprobs"] = {"tokens": [_token_str(t) for t in ids],
                                      "token_logprobs": [token_logprob(t) for t in ids],
                                      "top_logprobs": None, "text_offset": list(range(len(ids)))}
            if want_ids:
                ch["token_ids"] = ids
            choices.append(ch)
        out: dict[str, Any] = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                               "created": int(time.time()), "model": body.get("model", "fake-model"),
                               "choices": choices, "usage": usage, "policy_version": self.policy_version}
        if want_ids:
            out["prompt_token_ids"] = prompt_ids
        return web.json_response(out)

    @staticmethod
    def _lp_entry(t: int) -> dict[str, Any]:
        return {"token": _token_str(t), "logprob": token_logprob(t), "bytes": [t - 3], "top_logprobs": []}

    async def _stream(self, request: web.Request, body: dict[str, Any], chat: bool, n: int, text: str,
                      call: dict[str, Any] | None, finish: str, ids: list[int], prompt_ids: list[int],
                      rid: str, usage: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        want_ids = bool(body.get("return_token_ids"))
        want_lp = bool(body.get("logprobs"))
        obj = "chat.completion.chunk" if chat else "text_completion"
        base = {"id": rid, "object": obj, "created": int(time.time()), "model": body.get("model", "fake-model")}

        async def send(payload: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps({**base, **payload}).encode() + b"\n\n")

        first: dict[str, Any] = {"choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                              "finish_reason": None} for i in range(n)] if chat else [],
                                 "policy_version": self.policy_version}
        if want_ids:
            first["prompt_token_ids"] = prompt_ids
        if chat or want_ids:
            await send(first)
        # Tool-call arguments are sent as fragments, merged by index on the receiving side.
        pieces = [ids[k:k + 4] for k in range(0, len(ids), 4)] if call else [[t] for t in ids]
        for k, piece in enumerate(pieces):
            choices = []
            for i in range(n):
                ch: dict[str, Any] = {"index": i, "finish_reason": None}
                if chat and call:
                    frag: dict[str, Any] = {"index": 0, "function": {"arguments": decode(piece)}}
                    if k == 0:
                        frag.update(id=call["id"], type="function")
                        frag["function"]["name"] = call["function"]["name"]
                    ch["delta"] = {"tool_calls": [frag]}
                elif chat:
                    ch["delta"] = {"content": decode(piece)}
                else:
                    ch["text"] = decode(piece)
                if want_lp:
                    ch["logprobs"] = ({"content": [self._lp_entry(t) for t in piece]} if chat else
                                      {"tokens": [_token_str(t) for t in piece],
                                       "token_logprobs": [token_logprob(t) for t in piece]})
                if want_ids:
                    ch["token_ids"] = piece
                choices.append(ch)
            await send({"choices": choices})
        await send({"choices": [{"index": i, "delta": {} if chat else None, "text": "" if not chat else None,
                                 "finish_reason": finish} for i in range(n)]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@contextmanager
def start_fake_upstream(responder: Callable[[dict[str, Any]], Reply] | None = None,
                        delay_s: float = 0.0) -> Iterator[FakeUpstream]:
    """Serve a FakeUpstream on 127.0.0.1:<free port> in a background thread; always stopped on exit."""
    up = FakeUpstream(responder=responder or default_responder, delay_s=delay_s)
    http = ThreadedApp(up.make_app, name="rllm-fake-upstream", shutdown_timeout=60).start(10)
    up.url = http.url
    try:
        yield up
    finally:
        http.stop(timeout=10)
