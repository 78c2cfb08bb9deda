"""The model gateway: an OpenAI-compatible reverse proxy that records every LLM call as a Step.

    from rllm_core.gateway import UpstreamConfig, start_gateway
    with start_gateway([UpstreamConfig(url="http://127.0.0.1:8000/v1")]) as gw:
        client = OpenAI(base_url=gw.session_base_url("ep-1"), api_key="EMPTY")
        ...
        steps = gw.take_steps("ep-1")
"""

from rllm_core.gateway.app import AGENT_HEADER, DEFAULT_SESSION, SESSION_HEADER, create_app
from rllm_core.gateway.config import GatewayConfig, UpstreamConfig
from rllm_core.gateway.server import GatewayHandle, shared_gateway, start_gateway
from rllm_core.gateway.store import SessionStore

__all__ = [
    "AGENT_HEADER",
    "DEFAULT_SESSION",
    "SESSION_HEADER",
    "GatewayConfig",
    "GatewayHandle",
    "SessionStore",
    "UpstreamConfig",
    "create_app",
    "shared_gateway",
    "start_gateway",
]
