"""Addresses: the URL a client on this machine should use for a server bound to some host, and free ports.

A server bound to every interface (``0.0.0.0`` / ``::``) is reported at the loopback address: that URL works
from this machine, and the gateway recognises loopback upstreams as ours (it then injects `logprobs` and
`return_token_ids`). Clients on other machines use this machine's address with the same port.
"""

from __future__ import annotations

import socket

__all__ = ["client_host", "free_port"]

_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def client_host(host: str) -> str:
    """The host part of a URL that reaches a server bound to `host` from this machine (IPv6 in brackets)."""
    host = _ANY.get(host, host)
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def free_port(host: str) -> int:
    """A port free right now on `host` (for servers that need their port before they start, like vLLM)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
