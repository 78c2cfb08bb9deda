"""The route out of a harness's sandbox: its own gateway session, and nothing else.

The local sandbox has no network interface but its own loopback (bubblewrap `--unshare-all`). `HarnessRelay`
serves two Unix sockets from a host folder that is bound read-only into the sandbox at `/run/rllm`; inside,
`inside_relay.py` turns two loopback ports into byte pipes to them:

- `llm.sock` (port `LLM_PORT`): an HTTP proxy to the episode's gateway session (each call's completion budget
  capped at the run's `max_tokens`, or set to it when the harness sends none). Every request path is put under
  that session's URL (`/v1/messages` → `<gateway>/sessions/<name>~<sig>/v1/messages`), so the harness reaches its
  own session's LLM routes and nothing else: not another session, not the gateway's admin routes (steps, take,
  stats), not another service of the host. It counts the harness's calls and refuses those past the turn
  budget (400, in a shape both the OpenAI and the Anthropic SDKs show), and names the agent of each call for
  the gateway: the harness's name, or `<name>.side` for a call with the side model (titles, summaries), which
  the gateway records as a trajectory of its own, never mixed into the policy's.
- `egress.sock` (port `EGRESS_PORT`, given to the harness as HTTP(S)_PROXY): answers every proxy request
  (`CONNECT host:443`, `GET http://...`) with 403 and records what was asked: a harness that tries the
  internet is blocked (it has no route anyway) and the attempt is on the episode.
- `mcp.sock` (port `MCP_PORT`, only when the episode was given host MCP servers): `mcp_route.McpRoute`, each
  server by name and nothing else, every tool call recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from rllm_core.context import AGENT_HEADER
from rllm_harnesses.mcp_route import MCP_PORT, McpRoute

__all__ = ["EGRESS_PORT", "INSIDE_DIR", "LLM_PORT", "MCP_PORT", "HarnessRelay"]

log = logging.getLogger("rllm.harness")

LLM_PORT = 8808
EGRESS_PORT = 8809
INSIDE_DIR = "/run/rllm"
"""Where the relay's folder (its sockets and inside_relay.py) is bound inside the sandbox."""

_DROP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "authorization",
                   "x-api-key", "accept-encoding", "x-rllm-session", "x-rllm-agent", "proxy-authorization"})
_DROP_BACK = frozenset({"content-length", "transfer-encoding", "content-encoding", "connection", "keep-alive"})


class HarnessRelay:
    """Serve one episode's `llm.sock` and `egress.sock` (module docstring) from a thread of its own."""

    def __init__(self, session_url: str, *, agent: str, side_model: str, max_turns: int,
                 max_tokens: int | None = None, mcp: McpRoute | None = None) -> None:
        self.session_root = session_url.rstrip("/").removesuffix("/v1")
        self.agent, self.side_model, self.max_turns = agent, side_model, max_turns
        self.max_tokens = max_tokens
        self.mcp = mcp
        """The host MCP servers this sandbox may reach (None: no `mcp.sock`), and the tool calls made to them."""
        """The run's per-call completion budget: a harness asking for more (Claude Code asks 32k) is capped."""
        self.calls = 0
        self.side_calls = 0
        self.refused = 0
        self.errors: list[str] = []
        """Calls the gateway answered with an error (the first 300 characters of each)."""
        self.egress: list[str] = []
        """What the harness asked the proxy for (`CONNECT host:port`, `GET http://...`): every one was refused."""
        self.dir = Path(tempfile.mkdtemp(prefix="rllm-harness-"))
        os.chmod(self.dir, 0o755)  # the sandbox's uid must reach the sockets
        shutil.copy(Path(__file__).with_name("inside_relay.py"), self.dir / "inside_relay.py")
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="rllm-harness-relay", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> HarnessRelay:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    def close(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(15)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> HarnessRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def inside_command(self) -> str:
        """The shell lines that start the pipes inside the sandbox and wait until the LLM port answers."""
        mcp = f" {MCP_PORT}={INSIDE_DIR}/mcp.sock" if self.mcp is not None else ""
        return (f"/usr/bin/python3 {INSIDE_DIR}/inside_relay.py {LLM_PORT}={INSIDE_DIR}/llm.sock "
                f"{EGRESS_PORT}={INSIDE_DIR}/egress.sock{mcp} >/dev/null 2>&1 &\n"
                f"for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{LLM_PORT}) 2>/dev/null && break; "
                "sleep 0.05; done\n")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # a failed bind: reported by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=900),
                                     auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", lambda request: self._forward(request, http))
        runners = [web.AppRunner(app, access_log=None)]
        sockets = {"llm.sock": runners[0]}
        if self.mcp is not None:
            runners.append(web.AppRunner(self.mcp.app(http), access_log=None))
            sockets["mcp.sock"] = runners[1]
        egress = None
        try:
            for name, runner in sockets.items():
                await runner.setup()
                await web.UnixSite(runner, str(self.dir / name)).start()
            egress = await asyncio.start_unix_server(self._refuse, str(self.dir / "egress.sock"))
            for name in (*sockets, "egress.sock"):
                os.chmod(self.dir / name, 0o777)
            self._ready.set()
            await self._stop.wait()
        finally:
            if egress is not None:
                egress.close()
            for runner in runners:
                await runner.cleanup()
            await http.close()

    # ------------------------------------------------------------------ the LLM route
    def _read(self, body: bytes, tail: str) -> tuple[str, bytes]:
        """(the agent the call is recorded under, the body to send: its completion budget capped, or set to the
        run's when the harness sends none: a server's default is the whole context)."""
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return self.agent, body
        agent = f"{self.agent}.side" if data.get("model") == self.side_model else self.agent
        if self.max_tokens is None:
            return agent, body
        capped = False
        keys = [k for k in ("max_tokens", "max_completion_tokens", "max_output_tokens") if k in data]
        for key in keys:
            value = data[key]
            if not isinstance(value, int) or value > self.max_tokens:
                data[key], capped = self.max_tokens, True
        if not keys:
            data["max_output_tokens" if tail.endswith("/responses") else "max_tokens"] = self.max_tokens
            capped = True
        return agent, json.dumps(data).encode() if capped else body

    async def _forward(self, request: web.Request, http: aiohttp.ClientSession) -> web.StreamResponse:
        tail = request.match_info["tail"].strip("/")
        parts = tail.split("/")
        if parts[0] != "v1" or any(p in ("", ".", "..") for p in parts):  # only the session's own /v1 routes
            return web.json_response({"type": "error", "error": {"type": "not_found_error", "message":
                                      f"no route {request.method} /{tail} here: only /v1/... reaches the model"}},
                                     status=404)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        if request.method == "POST":
            agent, body = self._read(body, tail)
            if agent == self.agent:
                if self.calls >= self.max_turns:
                    self.refused += 1
                    message = (f"this episode's turn budget ({self.max_turns} model calls) is spent; "
                               "no more calls are served")
                    return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                                         "message": message, "code": 400}},
                                             status=400)
                self.calls += 1
            else:
                self.side_calls += 1
            headers[AGENT_HEADER] = agent
        target = self.session_root + "/" + tail
        if request.query_string:
            target += "?" + request.query_string
        try:
            async with http.request(request.method, target, data=body or None, headers=headers) as up:
                if up.status >= 400:  # kept for the episode: why the harness got no answer
                    said = await up.read()
                    text = said[:300].decode(errors="replace")
                    self.errors.append(f"{request.method} /{tail}: HTTP {up.status}: {text}")
                    return web.Response(body=said, status=up.status, headers={
                        k: v for k, v in up.headers.items() if k.lower() not in _DROP_BACK})
                out = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in _DROP_BACK})
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except aiohttp.ClientError as exc:
            return web.json_response({"type": "error", "error": {"type": "api_error", "message":
                                      f"the gateway could not be reached: {exc}"}}, status=502)

    # ------------------------------------------------------------------ the refusing proxy
    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            first = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, _, rest = first.partition(" ")
            self.egress.append(f"{method} {rest.rsplit(' ', 1)[0]}"[:300])
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            self.egress.append("(unreadable proxy request)")
        text = b"blocked: this sandbox reaches only its model endpoint\n"
        try:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                         b"Content-Length: " + str(len(text)).encode() + b"\r\n\r\n" + text)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def summary(self) -> dict[str, Any]:
        return {"calls": self.calls, "side_calls": self.side_calls, "refused_calls": self.refused,
                "blocked_egress": list(self.egress), "errors": self.errors[-10:]}
