"""A deadline for a connection's first request headers, which aiohttp's server does not have.

aiohttp closes an idle keep-alive connection after `keepalive_timeout`, but a client that connects and then
sends nothing, or trickles a header a byte at a time, holds its connection (and a handler) for that whole time
— an hour by default; two hundred such connections stayed open for as long as they liked. The gateway wraps
each connection's protocol: until the first `\\r\\n\\r\\n` arrives the connection has `HEADER_TIMEOUT_S`, then it
is closed. After the first request the server's own `keepalive_timeout` (set by the gateway) bounds the rest.

`HeaderBoundRunner` is an `aiohttp.web.AppRunner` whose sites get the wrapped protocol factory; everything else
(shutdown, cleanup, addresses) is the runner's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["HEADER_TIMEOUT_S", "KEEPALIVE_TIMEOUT_S", "HeaderBoundRunner"]

HEADER_TIMEOUT_S = 10.0
"""Seconds from connect until the first request's headers are complete."""
KEEPALIVE_TIMEOUT_S = 75.0
"""Idle seconds a kept-alive connection stays open (nginx's default; longer than the 5-15 s after which HTTP
clients drop idle pooled connections themselves, so a client never sends on a connection being closed)."""


class _HeaderDeadline(asyncio.Protocol):
    """Forwards everything to aiohttp's handler; closes the transport if no header end is seen in time."""

    def __init__(self, inner: Any, timeout_s: float) -> None:
        self._inner = inner
        self._timeout_s = timeout_s
        self._tail = b""
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self._expire)
        self._inner.connection_made(transport)

    def _expire(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            window = self._tail + data
            if b"\r\n\r\n" in window:
                self._timer.cancel()
                self._timer = None
            self._tail = window[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class HeaderBoundRunner(web.AppRunner):
    """An AppRunner whose connections must send their first headers within `header_timeout_s`."""

    def __init__(self, app: web.Application, *, header_timeout_s: float | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", KEEPALIVE_TIMEOUT_S)
        super().__init__(app, **kwargs)
        self._header_timeout_s = header_timeout_s

    @property
    def server(self) -> Callable[[], asyncio.Protocol] | None:  # type: ignore[override]
        inner = super().server
        if inner is None:
            return None
        timeout = self._header_timeout_s if self._header_timeout_s is not None else HEADER_TIMEOUT_S
        return lambda: _HeaderDeadline(inner(), timeout)
