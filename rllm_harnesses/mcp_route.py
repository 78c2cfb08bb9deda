"""The MCP route out of a harness's sandbox: the environment's MCP servers on the host, by name, and nothing else.

`harness_rollout(name, mcp_servers={"search": McpHttpServer("http://127.0.0.1:8765/mcp")})` offers a host MCP
server (streamable HTTP) to a CLI agent whose sandbox has no network. The harness is told the server is at
`http://127.0.0.1:MCP_PORT/search` (its own loopback); `inside_relay.py` pipes that port to `mcp.sock`, which this
route serves: `/<name>` goes to that server's URL, any other path is a 404, so the sandbox reaches the servers it
was given and no other host service. Headers pass both ways (the MCP session id rides in `Mcp-Session-Id`) but
not the sandbox's credentials; the server's own `headers` (a token) are added here, never seen inside.

Each JSON-RPC `tools/call` is recorded (name, arguments, result size, latency, error) as a
`rllm_core.tool_record.ToolCallRecord`, the record in-process tool calls leave, and lands on the episode as
`artifacts["tool_log"]` with transport "mcp", which `rllm view` shows. The response is passed on as it streams
(JSON or server-sent events); a copy of at most `_TEE_LIMIT` bytes is kept to read the result's size and error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from rllm_core.tool_record import ToolCallRecord, clip_arguments

__all__ = ["MCP_PORT", "McpRoute"]

MCP_PORT = 8810
_TEE_LIMIT = 4 * 1024 * 1024
_DROP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "authorization",
                   "x-api-key", "accept-encoding", "proxy-authorization", "cookie"})
_DROP_BACK = frozenset({"content-length", "transfer-encoding", "content-encoding", "connection", "keep-alive"})


def _calls_in(body: bytes) -> dict[Any, tuple[str, Any]]:
    """JSON-RPC id -> (tool name, arguments) of each `tools/call` in a request body (one message or a batch)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return {}
    messages = data if isinstance(data, list) else [data]
    calls = {}
    for msg in messages:
        if isinstance(msg, dict) and msg.get("method") == "tools/call" and "id" in msg:
            params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
            calls[msg["id"]] = (str(params.get("name", "")), params.get("arguments") or {})
    return calls


def _messages_in(payload: bytes, content_type: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a response: a JSON body, or the `data:` lines of server-sent events."""
    texts = [payload.decode(errors="replace")]
    if "event-stream" in content_type:
        texts = [line[5:].strip() for line in texts[0].splitlines() if line.startswith("data:")]
    out: list[dict[str, Any]] = []
    for text in texts:
        try:
            data = json.loads(text)
        except ValueError:
            continue
        out.extend(m for m in (data if isinstance(data, list) else [data]) if isinstance(m, dict))
    return out


def _outcome(message: dict[str, Any] | None) -> tuple[int, str | None]:
    """(result characters, error) of one `tools/call` answer."""
    if message is None:
        return 0, "no answer to the call was read"
    if isinstance(message.get("error"), dict):
        return 0, str(message["error"].get("message", message["error"]))[:500]
    result = message.get("result") if isinstance(message.get("result"), dict) else {}
    text = "".join(str(part.get("text", "")) for part in result.get("content") or [] if isinstance(part, dict))
    return len(text), (text[:500] or "the tool reported an error") if result.get("isError") else None


class McpRoute:
    """Forward `/<name>` to `upstreams[name]` (module docstring); `records` are the tool calls seen."""

    def __init__(self, upstreams: Mapping[str, str], headers: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.upstreams = dict(upstreams)
        self.headers = {name: dict(h) for name, h in (headers or {}).items()}
        self.records: list[dict[str, Any]] = []

    def app(self, http: aiohttp.ClientSession) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", lambda request: self._forward(request, http))
        return app

    async def _forward(self, request: web.Request, http: aiohttp.ClientSession) -> web.StreamResponse:
        name = request.match_info["tail"].strip("/")
        if name not in self.upstreams:
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32601, "message": f"no MCP server {name!r} here; this sandbox was given "
                                           f"{sorted(self.upstreams)}"}}, status=404)
        body = await request.read()
        calls = _calls_in(body) if request.method == "POST" else {}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        headers.update(self.headers.get(name, {}))
        started, clock = time.time(), time.monotonic()
        tee = bytearray()
        try:
            async with http.request(request.method, self.upstreams[name], data=body or None, headers=headers) as up:
                out = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in _DROP_BACK})
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    if calls and len(tee) < _TEE_LIMIT:
                        tee.extend(chunk)
                    await out.write(chunk)
                await out.write_eof()
                content_type = up.headers.get("content-type", "")
        except aiohttp.ClientError as exc:
            self._record(calls, started, clock, {}, f"the MCP server could not be reached: {exc}")
            return web.json_response({"jsonrpc": "2.0", "id": next(iter(calls), None), "error": {
                "code": -32603, "message": f"MCP server {name!r} could not be reached: {exc}"}}, status=502)
        answers = {m.get("id"): m for m in _messages_in(bytes(tee), content_type)} if calls else {}
        self._record(calls, started, clock, answers, None)
        return out

    def _record(self, calls: dict[Any, tuple[str, Any]], started: float, clock: float,
                answers: dict[Any, dict[str, Any]], failure: str | None) -> None:
        latency = round(time.monotonic() - clock, 6)
        for msg_id, (tool, arguments) in calls.items():
            chars, error = (0, failure) if failure else _outcome(answers.get(msg_id))
            self.records.append(ToolCallRecord(name=tool, arguments=clip_arguments(arguments), result_chars=chars,
                                               latency_s=latency, error=error, started_at=started,
                                               transport="mcp").model_dump())
