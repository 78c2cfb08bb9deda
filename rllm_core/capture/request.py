"""One intercepted LLM request: what the client asked for, and the body actually sent upstream.

Both transports (gateway, in-process) call `prepare_call` on the raw request body. It records what the client
asked for (so the fields we add can be stripped from what it gets back) and, for upstreams that support it,
asks for `logprobs` and `return_token_ids` so every Step carries the server's own ids.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from rllm_core.capture import _json
from rllm_core.errors import CaptureError

__all__ = ["CallRequest", "Endpoint", "endpoint_of", "is_loopback", "prepare_call"]

Endpoint = Literal["chat", "completions"]

_NOT_PARAMS = frozenset({"messages", "prompt", "model"})


@dataclass(slots=True)
class CallRequest:
    """The request half of one captured call."""

    endpoint: Endpoint
    body: dict[str, Any]
    """The body as the client sent it (before injection)."""
    upstream: str
    agent: str | None = None
    wants_logprobs: bool = True
    wants_token_ids: bool = True
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def strips(self) -> bool:
        """True when the response must be rewritten before the client sees it."""
        return not (self.wants_logprobs and self.wants_token_ids)

    @property
    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.body.items() if k not in _NOT_PARAMS}


def endpoint_of(path: str) -> Endpoint | None:
    """`chat` for .../chat/completions, `completions` for .../completions, None for anything else."""
    path = "/" + path.strip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    return None


def is_loopback(url: str) -> bool:
    """True for upstreams on this machine (our policy server, a local vLLM): they accept vLLM fields."""
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _asked(value: Any) -> bool:
    return value is not None and value is not False


def prepare_call(
    raw: bytes, endpoint: Endpoint, *, upstream: str, inject: bool, agent: str | None = None
) -> tuple[CallRequest, bytes]:
    """Parse a request body; return the call record and the bytes to send upstream.

    Raises CaptureError (with what to fix) when the body is not a JSON object.
    """
    try:
        body = _json.loads(raw) if raw else None
    except ValueError as exc:
        raise CaptureError(f"request body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise CaptureError(
            f"request body must be a JSON object, got {type(body).__name__}; send e.g. "
            '{"model": ..., "messages": [...]}'
        )
    call = CallRequest(endpoint=endpoint, body=body, upstream=upstream, agent=agent)
    if not inject:
        return call, raw
    call.wants_logprobs = _asked(body.get("logprobs"))
    call.wants_token_ids = _asked(body.get("return_token_ids"))
    if not call.strips:
        return call, raw
    sent = dict(body)
    if not call.wants_logprobs:
        # `true` on /completions too: vLLM's int field reads it as 1, our policy server as "sampled token only".
        sent["logprobs"] = True
    if not call.wants_token_ids:
        sent["return_token_ids"] = True
    return call, _json.dumps(sent)
