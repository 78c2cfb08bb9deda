"""An aiohttp application served from its own event loop on a background thread, behind a synchronous handle.

The policy server, `rllm view`, and the test upstreams all need the same thing: start listening (port 0 picks a
free one) and return once bound, so sync code, async code and tests use one handle alike; report a failed bind as
the exception it was; stop idempotently (runner cleanup, optional last coroutine, loop stopped, thread joined,
loop closed).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rllm_core.net import client_host

__all__ = ["ThreadedApp"]


class ThreadedApp:
    """`make_app()` served on host:port from a thread of its own (see the module docstring)."""

    def __init__(self, make_app: Callable[[], web.Application], host: str = "127.0.0.1", port: int = 0, *,
                 name: str = "rllm-http", shutdown_timeout: float = 5.0, **runner_options: Any) -> None:
        self.host, self.requested_port = host, port
        self.port = 0
        self.url = ""
        """``http://<host>:<port>``, no trailing slash; set once listening."""
        self._make_app, self._shutdown_timeout, self._runner_options = make_app, shutdown_timeout, runner_options
        self.loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        runner = web.AppRunner(self._make_app(), access_log=None, shutdown_timeout=self._shutdown_timeout,
                               **self._runner_options)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.requested_port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()  # a failed bind leaves nothing open
            raise
        self._runner = runner
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self.url = f"http://{client_host(self.host)}:{self.port}"

    def start(self, timeout: float = 30) -> ThreadedApp:
        """Listen; returns once bound. Raises the bind's own exception (OSError: port in use, ...), or
        TimeoutError when nothing happened within `timeout`."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"did not start listening on {self.host}:{self.requested_port} within {timeout:g} s")
        if self._error is not None:
            self._close_loop()
            raise self._error
        return self

    def __enter__(self) -> ThreadedApp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._runner is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10, last: Callable[[], Awaitable[Any]] | None = None) -> None:
        """Stop serving (then run `last()` on the loop, e.g. to cancel stalled handlers) and join. Idempotent."""
        if self.running:
            for step in (self._runner.cleanup, last):  # type: ignore[union-attr]
                if step is not None:
                    try:
                        asyncio.run_coroutine_threadsafe(step(), self.loop).result(timeout)
                    except Exception:
                        pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
            self._runner = None
        self._close_loop()

    def _close_loop(self) -> None:
        if self._thread.is_alive():
            self._thread.join(5)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()
