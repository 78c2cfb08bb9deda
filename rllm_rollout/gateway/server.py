"""Running the gateway: in a background thread of this process (`start_gateway`, `shared_gateway`) or in
the foreground (`rllm gateway`). The handle is what rollouts use: session URLs in, Steps out."""

from __future__ import annotations

import asyncio
import atexit
import logging
import secrets
import threading
from typing import Any

from aiohttp import web

from rllm_core.errors import ConfigError
from rllm_core.net import client_host
from rllm_core.types import Step
from rllm_rollout.capture.request import is_loopback
from rllm_rollout.gateway.app import GATEWAY_KEY, ROUTER_KEY, create_app
from rllm_rollout.gateway.capability import session_segment
from rllm_rollout.gateway.client import RemoteGateway
from rllm_rollout.gateway.config import DEFAULT_MAX_BODY_BYTES, GatewayConfig, StoreLimits, UpstreamConfig
from rllm_rollout.gateway.header_deadline import HeaderBoundRunner
from rllm_rollout.gateway.open_store import open_store
from rllm_rollout.gateway.store import Store, TakeResult

__all__ = ["GatewayHandle", "shared_gateway", "start_gateway"]

log = logging.getLogger("rllm.gateway")
SHUTDOWN_GRACE_S = 2.0
"""How long calls still in flight when a gateway stops may take to finish before they are cancelled: short, so
an interrupted run (Ctrl-C with agents mid-call) exits at once rather than after the slowest generation."""


class GatewayHandle:
    """A gateway serving from a background thread; stop it (or use it as a context manager) when done."""

    def __init__(self, config: GatewayConfig, store: Store, host: str, port: int, *, owns_store: bool = False) -> None:
        self.config = config
        self.store = store
        self._owns_store = owns_store
        self.host = host
        self.port = port
        self.url = f"http://{client_host(host)}:{port}"
        """Where clients on this machine reach it (the loopback address when bound to all interfaces)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<GatewayHandle {self.url} upstreams={[u.url for u in self.config.upstreams]}>"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def addresses(self) -> list[Any]:
        """The socket addresses it listens on, as bound (e.g. [('127.0.0.1', 8080)])."""
        return list(self._runner.addresses) if self._runner is not None else []

    @property
    def client_api_key(self) -> str | None:
        """The bearer token clients must send (the gateway's `api_key`, generated when none was given); None
        only for a gateway started with `auth=False`."""
        return self.config.api_key

    def session_base_url(self, session_id: str) -> str:
        """The OpenAI base URL for one session: give it to the agent as `base_url`. It carries the session's
        signature (capability.py), so the agent needs no key: any key it sends, or none, works."""
        return f"{self.url}/sessions/{session_segment(session_id, self.config.api_key)}/v1"

    def steps(self, session_id: str) -> list[Step]:
        return self.store.steps(session_id)

    def remote(self) -> RemoteGateway:
        """A picklable client of this gateway, for rollouts in other processes on this machine (Ray workers)."""
        return RemoteGateway(self.url, api_key=self.config.api_key)

    def take(self, session_id: str) -> TakeResult:
        """Return the session's Steps, free them (and its upstream assignment) and close it; `in_flight` says
        how many of its calls were still running (their steps will be dropped as late)."""
        if self._runner is not None:
            return self._runner.app[GATEWAY_KEY].take(session_id)
        return self.store.take(session_id)

    async def atake(self, session_id: str) -> TakeResult:
        """`take` for async callers (the `GatewayClient` protocol); it never blocks on the network."""
        return self.take(session_id)

    def take_steps(self, session_id: str) -> list[Step]:
        """`take(...).steps`."""
        return self.take(session_id).steps

    async def atake_steps(self, session_id: str) -> list[Step]:
        return self.take(session_id).steps

    def stats(self) -> dict[str, Any]:
        """The store's and the lifecycle's counters (`GET /stats`): late steps, expiries, drops, calls in flight."""
        if self._runner is not None:
            return self._runner.app[GATEWAY_KEY].stats()
        return self.store.stats().model_dump()

    def set_upstreams(self, upstreams: list[UpstreamConfig] | list[str]) -> None:
        """Replace the model servers behind this gateway while it serves (a backend's replicas after a weight
        sync); calls in flight finish where they started."""
        from rllm_rollout.capture.retokenize import resolve_tokenizer
        from rllm_rollout.gateway.router import Upstream

        ups = [UpstreamConfig(url=u) if isinstance(u, str) else u for u in upstreams]
        router = self._runner.app[ROUTER_KEY] if self._runner is not None else None
        if router is None:
            raise ConfigError("the gateway is not running: start it before setting its upstreams")
        router.replace([Upstream(u, tokenizer=resolve_tokenizer(u.tokenizer)) for u in ups])
        self.config = self.config.model_copy(update={"upstreams": ups})

    def stop(self) -> None:
        loop, runner, thread = self._loop, self._runner, self._thread
        if loop is None or runner is None or thread is None or not thread.is_alive():
            if self._owns_store:
                self.store.close()
            return
        try:  # in-flight calls get SHUTDOWN_GRACE_S to finish, then are cancelled (an interrupted run's)
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(SHUTDOWN_GRACE_S + 10)
        except (TimeoutError, RuntimeError) as exc:  # stop anyway: this runs at exit, after Ctrl-C too
            log.debug("gateway cleanup did not finish: %r", exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)
        self._thread = None
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> GatewayHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()



def start_gateway(
    upstreams: list[UpstreamConfig] | UpstreamConfig | str,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    store: Store | str | None = None,
    limits: StoreLimits | None = None,
    auth: bool = True,
) -> GatewayHandle:
    """Start a gateway in a background thread on host:port (port 0 = a free one); returns once it listens.

    Clients must send `api_key` as a bearer token; without one a random token is generated (`client_api_key`):
    the gateway holds the upstream's key, so no process that merely reaches the port may spend it. `auth=False`
    turns that off, on a loopback address only. `store` is a `Store` (the caller closes it) or a spec, "memory"
    (the default) or "sqlite:PATH" (Steps survive a restart; closed with the gateway); `limits` bound a store
    built from a spec."""
    if isinstance(upstreams, (str, UpstreamConfig)):
        upstreams = [upstreams]  # type: ignore[list-item]
    ups = [UpstreamConfig(url=u) if isinstance(u, str) else u for u in upstreams]
    if not auth:
        if api_key:
            raise ConfigError("start_gateway: auth=False and an api_key contradict; pass one or the other")
        if not is_loopback(f"http://[{host}]" if ":" in host else f"http://{host}"):
            raise ConfigError(f"a gateway on {host} needs a client token (it holds the upstream's key): drop "
                              "auth=False / --no-auth, or bind 127.0.0.1")
    owns_store = store is None or isinstance(store, str)
    the_store = open_store(store, limits)
    if auth and not api_key:  # generated; a durable store keeps it, so a restart does not lock clients out
        api_key = secrets.token_urlsafe(24)
        if callable(keep := getattr(the_store, "client_token", None)):
            api_key = keep(api_key)
    try:
        config = GatewayConfig(upstreams=ups, api_key=api_key, max_body_bytes=max_body_bytes)
        app = create_app(config, the_store)
    except BaseException:
        if owns_store:
            the_store.close()
        raise
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def _start() -> None:
        runner = HeaderBoundRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()  # closes the upstream client session, so a failed bind leaves nothing open
            raise
        box["runner"], box["port"] = runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def _run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(_start())
        except BaseException as exc:
            box["error"] = exc
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=_run, name="rllm-gateway", daemon=True)
    thread.start()
    if not ready.wait(30) or "error" in box:
        if owns_store:
            the_store.close()
        err = box.get("error")
        raise ConfigError(f"the gateway could not listen on {host}:{port}: {err}; choose another --port") from err
    handle = GatewayHandle(config, the_store, host, box["port"], owns_store=owns_store)
    handle._loop, handle._runner, handle._thread = loop, box["runner"], thread
    return handle


_shared: dict[tuple[str, ...], GatewayHandle] = {}
_shared_lock = threading.Lock()


def shared_gateway(upstreams: list[UpstreamConfig]) -> GatewayHandle:
    """The process's in-process gateway for this upstream list: started on first use, then reused. It has a
    random client token like any gateway: rollouts hand it to their agents as `config.api_key`."""
    key = tuple(u.model_dump_json() for u in upstreams)
    with _shared_lock:
        handle = _shared.get(key)
        if handle is None or not handle.running:
            handle = _shared[key] = start_gateway(upstreams)
        return handle


@atexit.register
def _stop_shared() -> None:
    with _shared_lock:
        for handle in _shared.values():
            handle.stop()
        _shared.clear()
