"""Addresses: the URL a client on this machine should use for a server bound to some host, and free ports.

A server bound to every interface (``0.0.0.0`` / ``::``) is reported at the loopback address: that URL works
from this machine, and the gateway recognises loopback upstreams as ours (it then injects `logprobs` and
`return_token_ids`). Clients on other machines use this machine's address with the same port.

`check_reachable` probes an OpenAI-compatible endpoint; it lives here, not with the eval engine, so that
`rllm model setup` (which probes a server) and `rllm eval` share it without importing each other.
"""

from __future__ import annotations

import logging
import socket

from rllm_core.errors import UpstreamError

__all__ = ["check_reachable", "client_host", "free_port"]

_eval_log = logging.getLogger("rllm.eval")
"""check_reachable's warning is about an eval's --base-url: logged where `rllm eval`'s other warnings are."""

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


def check_reachable(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """GET {base_url}/models; UpstreamError naming the URL when nothing answers or the key is refused.

    Returns the model ids the endpoint lists (empty when it lists none or has no /models)."""
    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    import httpx  # late: the address helpers are imported by servers that never probe

    try:
        resp = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UpstreamError(
            f"model endpoint {base_url} is not reachable ({type(exc).__name__}: {exc}). Start the server, fix "
            "--base-url, or run `rllm model setup`; without either, `rllm eval` starts the embedded model."
        ) from exc
    if resp.status_code in (401, 403):
        raise UpstreamError(f"model endpoint {base_url} refused the API key (HTTP {resp.status_code}); "
                            "check the key's environment variable (`rllm model show`) or --api-key-env")
    if resp.status_code >= 400:  # some OpenAI-compatible servers have no /models: say so, do not stop
        v1 = base_url.rstrip("/").endswith("/v1")
        hint = "" if v1 else " (an OpenAI-compatible base URL usually ends in /v1)"
        _eval_log.warning("GET %s answered HTTP %s%s; going on, but check --base-url if every episode fails",
                    url, resp.status_code, hint)
        return []
    try:
        return [str(m["id"]) for m in resp.json().get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError):
        return []
