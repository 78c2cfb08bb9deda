"""The oracle as an OpenAI-compatible chat endpoint: what an agent's unchanged client calls for demonstrations.

`POST /v1/chat/completions` answers with the oracle's message (`content`, or `tool_calls` with finish_reason
`tool_calls`), `GET /v1/models` lists `oracle`. It returns no token ids or logprobs: the gateway records each call
with its messages and reply, and `rllm sft` renders them with the policy's own chat template (sft_data.py), so
the demonstrations fit any model trained on them. Streaming requests get the same message as one chunk.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from rllm_core.threaded_app import ThreadedApp
from rllm_envs.demos.oracles import Oracle

__all__ = ["ORACLE_MODEL", "OracleServer", "serve_oracle"]

ORACLE_MODEL = "oracle"


class OracleServer:
    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self.calls = 0
        self.url = ""

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": ORACLE_MODEL, "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "the body is not JSON"}}, status=400)
        messages = body.get("messages")
        if not isinstance(messages, list):
            return web.json_response({"error": {"message": "messages must be a list"}}, status=400)
        self.calls += 1
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        message = {"role": "assistant", "content": "", **self.oracle(messages, tools)}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": ORACLE_MODEL}
        if not body.get("stream"):
            return web.json_response({**base, "object": "chat.completion", "usage": {
                "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        delta = dict(message)
        if delta.get("tool_calls"):
            delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(delta["tool_calls"])]
        for choice in ({"index": 0, "delta": delta, "finish_reason": None},
                       {"index": 0, "delta": {}, "finish_reason": finish}):
            chunk = {**base, "object": "chat.completion.chunk", "choices": [choice]}
            await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out


@contextmanager
def serve_oracle(oracle: Oracle) -> Iterator[OracleServer]:
    """Serve on 127.0.0.1:<free port> from a thread; `server.url` ends in /v1; always stopped."""
    server = OracleServer(oracle)
    with ThreadedApp(server.make_app, name="rllm-oracle") as http:
        server.url = f"{http.url}/v1"
        yield server
