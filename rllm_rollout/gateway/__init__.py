"""The model gateway: an OpenAI-compatible reverse proxy that records every LLM call as a Step.

    from rllm_rollout.gateway import UpstreamConfig, start_gateway
    with start_gateway([UpstreamConfig(url="http://127.0.0.1:8000/v1")]) as gw:
        client = OpenAI(base_url=gw.session_base_url("ep-1"), api_key=gw.client_api_key)
        ...
        steps = gw.take_steps("ep-1")

A gateway in another process (`rllm gateway`, or the driver's, seen from a Ray worker) is reached through
`RemoteGateway(url, api_key)`; both satisfy `GatewayClient`, what `Rollout.arun(gateway=...)` takes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rllm_rollout.gateway.app import AGENT_HEADER, DEFAULT_SESSION, SESSION_HEADER, create_app
    from rllm_rollout.gateway.client import GatewayClient, RemoteGateway
    from rllm_rollout.gateway.config import GatewayConfig, UpstreamConfig
    from rllm_rollout.gateway.server import GatewayHandle, shared_gateway, start_gateway
    from rllm_rollout.gateway.store import SessionStore

_WHERE = {
    "AGENT_HEADER": "app", "DEFAULT_SESSION": "app", "SESSION_HEADER": "app", "create_app": "app",
    "GatewayClient": "client", "RemoteGateway": "client", "GatewayConfig": "config", "UpstreamConfig": "config",
    "GatewayHandle": "server", "shared_gateway": "server", "start_gateway": "server", "SessionStore": "store",
}


def __getattr__(name: str) -> Any:
    """Import on first use: the `rllm gateway` command (loaded by every `rllm` call) must not pull in aiohttp."""
    if name in _WHERE:
        value = getattr(importlib.import_module(f"rllm_rollout.gateway.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rllm_rollout.gateway' has no attribute {name!r}")


__all__ = [
    "AGENT_HEADER",
    "DEFAULT_SESSION",
    "SESSION_HEADER",
    "GatewayClient",
    "GatewayConfig",
    "GatewayHandle",
    "RemoteGateway",
    "SessionStore",
    "UpstreamConfig",
    "create_app",
    "shared_gateway",
    "start_gateway",
]
