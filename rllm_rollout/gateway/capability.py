"""Session URLs as capabilities: an agent needs its base URL, never a key.

An agent written the way vLLM users write them (`OpenAI(base_url=..., api_key="EMPTY")`, a key from
`OPENAI_API_KEY`, or none) sends whatever key it likes, so the gateway cannot ask the agent for its token. It asks
the URL instead: a session's base URL is `/sessions/<name>~<sig>/v1`, where `sig` is an HMAC of the session name
under the gateway's token (128 bits, URL-safe). Whoever holds the URL may call the LLM under that one session,
with any key or none; whoever does not cannot guess it, so cannot spend, read or pollute another session. The
routes that read or close sessions, the stats, and the default session (`/v1` with no session) keep the bearer
token; the upstream's key never leaves the gateway. The name stays the session's key everywhere else (store,
router, takes), so a rollout takes `name` as before.

Stateless on purpose: a gateway restarted with the same token (`--store sqlite:PATH`) honours the URLs it gave
out, and Ray workers holding a `RemoteGateway` mint URLs without a round trip.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = ["SEPARATOR", "session_segment", "split_segment", "verify_segment"]

SEPARATOR = "~"
"""Between a session's name and its signature in the URL (unreserved in URLs: never percent-encoded)."""
_SIG_BYTES = 16


def _sign(token: str, name: str) -> str:
    mac = hmac.new(token.encode(), b"rllm-session:" + name.encode(), hashlib.sha256).digest()[:_SIG_BYTES]
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def session_segment(name: str, token: str | None) -> str:
    """The `/sessions/<segment>/v1` path segment for session `name`: `name~sig` under a token, else `name`."""
    return f"{name}{SEPARATOR}{_sign(token, name)}" if token else name


def split_segment(segment: str) -> tuple[str, str | None]:
    """(session name, signature or None) of a path segment."""
    name, sep, sig = segment.rpartition(SEPARATOR)
    return (name, sig) if sep and name else (segment, None)


def verify_segment(segment: str, token: str) -> str | None:
    """The session name when `segment` carries a valid signature under `token` (constant-time), else None."""
    name, sig = split_segment(segment)
    if sig is None or not hmac.compare_digest(sig.encode(), _sign(token, name).encode()):
        return None
    return name
