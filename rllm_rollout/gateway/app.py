"""The gateway's aiohttp application: an OpenAI-compatible reverse proxy that records every call as Steps.

Routes (each also without the `/sessions/{id}` prefix, the session then taken from `X-RLLM-Session`):

    POST   /sessions/{id}/v1/chat/completions | /v1/completions    proxied upstream, recorded
    POST   /sessions/{id}/v1/responses | /v1/messages              proxied upstream, recorded (Messages: as Chat
                                                                  for a Chat-only upstream, capture/messages.py)
    GET    /sessions/{id}/v1/models                               proxied upstream
    GET    /sessions/{id}/steps                                   recorded Steps as JSON
    POST   /sessions/{id}/take[?take_id=T]                        recorded Steps as JSON, free them, close it
    DELETE /sessions/{id}/takes/{take_id}                         ack a take: forget its kept reply
    DELETE /sessions/{id}                                         free them, close it
    GET    /stats                                                 store and lifecycle counters
    GET    /health, /openapi.json                                 open: no token needed

When the gateway has a token (unless started with auth off), an LLM call under a signed session path
(`/sessions/<name>~<sig>/v1`, capability.py: the URL a rollout hands its agent) needs nothing more: the agent's
own key, whatever it is, is ignored and never forwarded. Every other route but /health and /openapi.json needs
`Authorization: Bearer <token>` (scheme case-insensitive); docs/gateway.md has who can reach what.
Nothing else under /v1 reaches the upstream (no files, fine-tuning, ...): other paths get an OpenAI-style 404 or
405 naming what is allowed. A taken or deleted session is closed: a new call for it gets 410, a step of a call
still in flight at the take is dropped and counted (store.py has the lifecycle).

aiohttp on both sides (server and upstream client): a FastAPI + httpx hop measured ~3.4 ms CPU per call
here, aiohttp ~1.0 ms. A Step is recorded before the last byte (`[DONE]`) reaches the client, so a rollout
that takes its steps as soon as its call returns never misses one.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from urllib.parse import quote

import aiohttp
from aiohttp import web
from yarl import URL

from rllm_core.context import AGENT_HEADER, SESSION_HEADER
from rllm_core.errors import CaptureError
from rllm_core.plugins import get_plugin_manager
from rllm_core.types import Step
from rllm_rollout.capture import _json
from rllm_rollout.capture.assemble import CallAssembler, error_step, request_messages, upstream_error
from rllm_rollout.capture.assemblers import make_assembler
from rllm_rollout.capture.messages import anthropic_error
from rllm_rollout.capture.request import CallRequest, endpoint_of, prepare_call, prepare_messages_via_chat
from rllm_rollout.capture.retokenize import resolve_tokenizer
from rllm_rollout.gateway.capability import split_segment, verify_segment
from rllm_rollout.gateway.config import GatewayConfig
from rllm_rollout.gateway.router import Upstream, UpstreamRouter
from rllm_rollout.gateway.routes import json_error as _error
from rllm_rollout.gateway.routes import no_route, not_allowed, openapi
from rllm_rollout.gateway.store import DEFAULT_SESSION, IN_FLIGHT_HEADER, MemoryStore, Store, TakeResult
from rllm_rollout.gateway.turns import TurnTracker

__all__ = ["AGENT_HEADER", "DEFAULT_SESSION", "SESSION_HEADER", "create_app"]

log = logging.getLogger("rllm.gateway")

_DROP_REQUEST = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                           "authorization", "x-api-key", "accept-encoding", "x-rllm-session", "x-rllm-agent", "te",
                           "upgrade", "proxy-authorization", "proxy-connection", "trailer", "expect"})
_DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "content-encoding", "connection",
                            "keep-alive", "date", "server"})

STORE_KEY = web.AppKey("store", Store)
ROUTER_KEY = web.AppKey("router", UpstreamRouter)
TURNS_KEY = web.AppKey("turns", TurnTracker)
GATEWAY_KEY: web.AppKey[_Gateway] = web.AppKey("gateway")


def _steps_response(steps: list[Step]) -> web.Response:
    """Steps as a JSON list, each exactly as `Step.model_dump_json` writes it (NaN/Infinity round-trip)."""
    body = b"[" + b",".join(s.model_dump_json().encode() for s in steps) + b"]"
    return web.Response(body=body, content_type="application/json")


class _Gateway:
    """The handlers, holding their dependencies (config, store, router, upstream HTTP session)."""

    def __init__(self, config: GatewayConfig, store: Store, router: UpstreamRouter) -> None:
        self.config = config
        self.store = store
        self.router = router
        self.turns = TurnTracker()
        self.http: aiohttp.ClientSession | None = None
        self._bearer = f"Bearer {config.api_key}".encode() if config.api_key else None
        self._token = config.api_key.encode() if config.api_key else None
        self.in_flight: dict[str, int] = {}
        """Calls being served per session, so a take can say how many of its steps are still to come."""
        self.refused_calls = 0
        get_plugin_manager()  # load plugins now, not on the first call

    async def on_startup(self, app: web.Application) -> None:
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60),
            auto_decompress=True, skip_auto_headers=("User-Agent",),
        )

    async def on_cleanup(self, app: web.Application) -> None:
        if self.http is not None:
            await self.http.close()

    # ------------------------------------------------------------------ helpers
    def _denied(self, request: web.Request) -> web.Response | None:
        """401 unless the request carries the gateway's token: the scheme matched case-insensitively (RFC 7235),
        the token in constant time (no timing oracle on a gateway reachable from a cluster)."""
        if self._token is None:
            return None
        scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token):
            return None
        key = request.headers.get("x-api-key")  # the Anthropic SDK's header
        if key is not None and hmac.compare_digest(key.strip().encode(), self._token):
            return None
        return _error(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>' (an agent gets it "
                           "as config.api_key; a GatewayHandle has it as .client_api_key; `rllm gateway` prints it)",
                      "authentication_error")

    def _session(self, request: web.Request) -> tuple[str, web.Response | None]:
        """(session name, None) for an LLM call the gateway may serve, else (name, the 401 to send).

        A session path carrying its signature (`/sessions/<name>~<sig>/v1`, capability.py) is its own proof:
        the agent's key, whatever it is ("EMPTY", an env key, none), is not looked at. A session path without
        one, or the default session (`/v1`, an `X-RLLM-Session` header), needs the bearer token."""
        segment = request.match_info.get("session_id")
        if segment is None:
            name = request.headers.get(SESSION_HEADER) or DEFAULT_SESSION
            return name, self._denied(request)
        name, _ = split_segment(segment)
        if self._token is None or verify_segment(segment, self.config.api_key or "") is not None:
            return name, None
        if self._denied(request) is None:
            return name, None
        return name, _error(401, f"session {name!r}: this URL is not a session URL this gateway gave out (its "
                                 "signature is missing or wrong); use the base URL the rollout passed the agent "
                                 "(config.base_url), or send the gateway's bearer token", "authentication_error")

    def _record(self, session_id: str, steps: list[Step], up: Upstream | None = None) -> None:
        """Store a call's Steps. Never raises: a failing store costs the Steps (logged), never the client's reply."""
        try:
            late = self.store.add(session_id, steps)  # a closed session's: dropped, counted, logged by the store
        except Exception:
            log.exception("gateway: recording the steps of a call failed; the call itself went through")
            return
        if not late and up is not None and up.config.exact_turns:  # only these take the next turn's hint
            self.turns.record(session_id, steps)
        # No plugin event here: this may be another process; the driver sends rllm_on_llm_call once per Step
        # when the episode reaches it (rllm_core.context.report_llm_calls).

    def _upstream_headers(self, request: web.Request, up: Upstream, native_messages: bool = False) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        if request.method == "POST" and "Content-Type" not in request.headers:
            headers["Content-Type"] = "application/json"
        if up.config.api_key:
            headers["Authorization"] = f"Bearer {up.config.api_key}"
            if native_messages:
                headers["x-api-key"] = up.config.api_key
        elif self._bearer is None:  # no gateway token: the client's key is for upstream
            for name in ("Authorization", "x-api-key"):
                if name in request.headers:
                    headers[name] = request.headers[name]
        return headers

    @staticmethod
    def _client_headers(resp: aiohttp.ClientResponse) -> dict[str, str]:
        return {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}

    @staticmethod
    def _timeout(up: Upstream) -> aiohttp.ClientTimeout:
        t = up.config.timeout_s
        return aiohttp.ClientTimeout(total=None, sock_connect=min(t, 30.0), sock_read=t)

    # ------------------------------------------------------------------ session routes
    async def get_steps(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        return _steps_response(self.store.steps(_name(request)))

    def take(self, session_id: str, take_id: str | None = None) -> TakeResult:
        """Take a session (HTTP route and in-process handle alike): free its upstream assignment and turns,
        close it, and say how many of its calls are still in flight (their steps will arrive late)."""
        self.router.forget(session_id)
        self.turns.forget(session_id)
        result = self.store.take(session_id, take_id=take_id, in_flight=self.in_flight.get(session_id, 0))
        if result.in_flight and not result.retried:
            log.info("session %s taken with %d call(s) still in flight: their steps will be dropped as late",
                     session_id, result.in_flight)
        return result

    async def take_steps(self, request: web.Request) -> web.Response:
        """Read, free and close in one step, so a remote rollout (another process, a Ray worker) misses nothing;
        `?take_id=` makes a retry after a lost reply return the same steps."""
        if (denied := self._denied(request)) is not None:
            return denied
        result = self.take(_name(request), request.query.get("take_id") or None)
        resp = _steps_response(result.steps)
        resp.headers[IN_FLIGHT_HEADER] = str(result.in_flight)
        return resp

    async def ack_take(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        return web.json_response({"acked": self.store.ack(_name(request), request.match_info["take_id"])})

    async def delete_session(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        sid = _name(request)
        self.router.forget(sid)
        self.turns.forget(sid)
        return web.json_response({"deleted": self.store.delete(sid)})

    def stats(self) -> dict[str, object]:
        return {**self.store.stats().model_dump(), "in_flight": sum(self.in_flight.values()),
                "refused_calls": self.refused_calls, "upstreams": [u.url for u in self.router.upstreams]}

    async def get_stats(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        return web.json_response(self.stats())

    async def health(self, request: web.Request) -> web.Response:
        """Liveness only: it needs no token, so it says nothing about the upstreams (/stats does, with one)."""
        return web.json_response({"status": "ok"})

    # ------------------------------------------------------------------ what reaches the proxy
    async def call(self, request: web.Request) -> web.StreamResponse:
        """The gate in front of `proxy`: the token, the allowed routes, the session's lifecycle (a closed
        session gets 410: its rollout has its steps already), and the count of the session's calls in flight."""
        sid, denied = self._session(request)
        if denied is not None:
            return denied
        if (refused := not_allowed(request.method, request.match_info["tail"])) is not None:
            return refused
        if self.store.is_closed(sid):
            self.refused_calls += 1
            log.warning("call %s %s for session %s refused: the session was already taken (%d refused so far)",
                        request.method, request.path, sid, self.refused_calls)
            return _error(410, f"session {sid} was already taken or deleted: its calls are no longer recorded; "
                               "start a new session id for new calls", "session_closed")
        self.in_flight[sid] = self.in_flight.get(sid, 0) + 1
        try:
            return await self.proxy(request, sid)
        finally:
            if (n := self.in_flight.get(sid, 1) - 1) > 0:
                self.in_flight[sid] = n
            else:
                self.in_flight.pop(sid, None)

    # ------------------------------------------------------------------ proxy
    async def proxy(self, request: web.Request, sid: str) -> web.StreamResponse:
        """Forward one call of session `sid` (`call` has checked who may make it) and record it."""
        tail = request.match_info["tail"]
        endpoint = endpoint_of(tail) if request.method == "POST" else None
        if (request.content_length or 0) > self.config.max_body_bytes:
            return self._too_large()
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._too_large()
        up = self.router.pick(sid)  # only now: a refused request never ties a session to a worker
        if endpoint is None:
            return await self._passthrough(request, up, tail, raw)
        via_chat = endpoint == "messages" and up.config.messages_api == "chat"
        agent = request.headers.get(AGENT_HEADER)
        try:
            if via_chat:
                call, sent = prepare_messages_via_chat(raw, upstream=up.url, inject=up.config.inject, agent=agent)
                tail = "chat/completions"
            else:
                call, sent = prepare_call(raw, endpoint, upstream=up.url, inject=up.config.inject, agent=agent)
                tail = "messages" if endpoint == "messages" else tail
        except CaptureError as exc:
            if endpoint == "messages":  # the client speaks Messages: the error in its shape
                return web.json_response(anthropic_error(str(exc), "invalid_request_error"), status=400)
            return _error(400, str(exc))
        if endpoint in ("chat", "messages") and up.config.exact_turns \
                and (hint := self.turns.hint(sid, {"messages": request_messages(call)})) is not None:
            sent = _json.dumps({**_json.loads(sent), "rllm_continue": hint})  # the server continues exactly
        if (model := up.config.model_for(call.agent)) is not None:  # a policy per role: the role's adapter
            sent = _json.dumps({**_json.loads(sent), "model": model})
        up.in_flight += 1
        try:
            return await self._forward(request, up, tail, sid, call, sent)
        finally:
            up.in_flight -= 1

    def _too_large(self) -> web.Response:
        return _error(400, f"request body is larger than the gateway's limit of {self.config.max_body_bytes} "
                           "bytes; send a smaller request or raise the limit (`rllm gateway --max-body-bytes N`, "
                           "`start_gateway(..., max_body_bytes=N)`)")

    async def _passthrough(self, request: web.Request, up: Upstream, tail: str, raw: bytes) -> web.StreamResponse:
        """GET models (and an LLM route the recorder does not parse), unrecorded; `call` refused the rest."""
        assert self.http is not None
        if (refused := not_allowed(request.method, tail)) is not None:  # `proxy` reached without `call`
            return refused
        try:
            target = URL(f"{up.url}/{quote(tail.strip('/'), safe='/')}", encoded=True)  # `?`, `%` stay in the path
            async with self.http.request(request.method, target, data=raw or None,
                                         headers=self._upstream_headers(request, up),
                                         timeout=self._timeout(up)) as resp:
                body = await resp.read()
                return web.Response(body=body, status=resp.status, headers=self._client_headers(resp))
        except TimeoutError:
            return _error(504, f"upstream {up.url} timed out after {up.config.timeout_s} s", "upstream_timeout")
        except aiohttp.ClientError as exc:
            return _error(502, f"upstream {up.url} failed: {type(exc).__name__}: {exc}", "upstream_error")

    async def _forward(self, request: web.Request, up: Upstream, tail: str, sid: str, call: CallRequest,
                       sent: bytes) -> web.StreamResponse:
        assert self.http is not None
        try:
            headers = self._upstream_headers(request, up, native_messages=tail == "messages")
            ctx = self.http.post(f"{up.url}/{tail}", data=sent, headers=headers, timeout=self._timeout(up))
            resp = await ctx.__aenter__()
        except TimeoutError:
            msg = f"upstream {up.url} timed out after {up.config.timeout_s} s"
            self._record(sid, [error_step(call, msg)])
            return _error(504, msg, "upstream_timeout")
        except aiohttp.ClientError as exc:
            msg = f"upstream {up.url} unreachable: {type(exc).__name__}: {exc}"
            self._record(sid, [error_step(call, msg)])
            return _error(502, msg, "upstream_error")
        try:
            if resp.status >= 400:
                body = await resp.read()
                said = body[:500].decode(errors='replace')
                self._record(sid, [error_step(call, upstream_error(resp.status, said))])
                if call.source is not None:  # the client speaks Messages: the Chat server's error in its shape
                    body = _json.dumps(anthropic_error(upstream_error(resp.status, said)))
                return web.Response(body=body, status=resp.status, headers=self._client_headers(resp))
            asm = make_assembler(call, sse="text/event-stream" in resp.headers.get("Content-Type", ""),
                                 tokenizer=up.tokenizer)
            if asm.sse:
                return await self._stream(request, resp, asm, sid, up)
            return await self._whole(resp, asm, sid, up)
        finally:
            await ctx.__aexit__(None, None, None)

    async def _whole(self, resp: aiohttp.ClientResponse, asm: CallAssembler, sid: str, up: Upstream) -> web.Response:
        error = None
        body = b""
        try:
            body = await resp.read()
        except TimeoutError:
            error = f"upstream {up.url} timed out after {up.config.timeout_s} s while sending its reply"
        except aiohttp.ClientError as exc:
            error = f"upstream failed while sending its reply: {type(exc).__name__}: {exc}"
        out = asm.feed(body)  # feed/finish never raise: a reply capture cannot parse still reaches the client
        tail, steps = asm.finish(error)
        self._record(sid, steps, up)
        if error is not None:
            return _error(504 if "timed out" in error else 502, error, "upstream_error")
        return web.Response(body=out + tail, status=resp.status, headers=self._client_headers(resp))

    async def _stream(self, request: web.Request, resp: aiohttp.ClientResponse, asm: CallAssembler,
                      sid: str, up: Upstream) -> web.StreamResponse:
        out_resp = web.StreamResponse(status=resp.status, headers=self._client_headers(resp))
        await out_resp.prepare(request)
        error: str | None = None
        client_gone = False
        recorded = False

        def record(steps: list[Step]) -> None:
            self._record(sid, steps, up)  # never raises: a failing store costs the Steps, never the stream

        try:  # asm.feed/finish never raise: a stream capture cannot parse still reaches the client whole
            while True:
                # our own bound on each read: aiohttp's sock_read never fires once its parser has failed on
                # garbage mid-stream (found by tests/test_gateway_fuzz.py), which hung the call for good
                async with asyncio.timeout(up.config.timeout_s):
                    chunk = await resp.content.readany()
                if not chunk:
                    break
                out = asm.feed(chunk)
                if asm.done and not recorded:  # record before the client sees [DONE]
                    tail, steps = asm.finish(None)
                    record(steps)
                    recorded, out = True, out + tail
                if out:
                    try:
                        await out_resp.write(out)
                    except ConnectionError:
                        client_gone = True
                        error = "the client disconnected before the stream ended"
                        break
        except TimeoutError:
            error = f"upstream {up.url} timed out mid-stream (no data for {up.config.timeout_s} s)"
        except aiohttp.ClientError as exc:
            error = f"upstream failed mid-stream: {type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            error = "the client disconnected before the stream ended"
            client_gone = True
            raise
        finally:
            if not recorded:
                tail, steps = asm.finish(error)
                record(steps)
                if tail and not client_gone:
                    try:
                        await out_resp.write(tail)
                    except ConnectionError:
                        client_gone = True
        if not client_gone:
            try:
                await out_resp.write_eof()
            except ConnectionError:
                pass
        return out_resp


def _name(request: web.Request) -> str:
    """The session name of a `/sessions/{id}/...` route (a signed segment's name: the routes that read or close
    a session take the bearer token, and accept the session URL's segment as well as its bare name)."""
    return split_segment(request.match_info["session_id"])[0]


def create_app(config: GatewayConfig, store: Store | None = None) -> web.Application:
    """Build the gateway app from its config and store (both given, so tests and embedders own them)."""
    store = store if store is not None else MemoryStore()
    router = UpstreamRouter([Upstream(u, tokenizer=resolve_tokenizer(u.tokenizer)) for u in config.upstreams])
    gw = _Gateway(config, store, router)
    app = web.Application(client_max_size=config.max_body_bytes)
    app[STORE_KEY] = store
    app[ROUTER_KEY] = router
    app[TURNS_KEY] = gw.turns
    app[GATEWAY_KEY] = gw
    app.on_startup.append(gw.on_startup)
    app.on_cleanup.append(gw.on_cleanup)
    r = app.router
    r.add_get("/health", gw.health)
    r.add_get("/openapi.json", openapi)
    r.add_get("/sessions/{session_id}/steps", gw.get_steps)
    r.add_get("/stats", gw.get_stats)
    r.add_post("/sessions/{session_id}/take", gw.take_steps)
    r.add_delete("/sessions/{session_id}/takes/{take_id}", gw.ack_take)
    r.add_delete("/sessions/{session_id}", gw.delete_session)
    r.add_route("*", "/sessions/{session_id}/v1/{tail:.*}", gw.call)
    r.add_route("*", "/v1/{tail:.*}", gw.call)
    r.add_route("*", "/{tail:.*}", no_route)  # last: only what nothing above matched, at no cost to the rest
    return app
