"""OpenAI SDK adapter: capture needs nothing; `wrap_client` adds the agent name.

    from rllm_adapters.openai_sdk import wrap_client
    solver = wrap_client(openai.OpenAI(base_url=config.base_url, api_key=config.api_key), name="solver")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllm_adapters._common import lazy_exports
from rllm_adapters.openai_sdk.plugin import TESTED_VERSIONS

if TYPE_CHECKING:
    from rllm_adapters.openai_sdk.wrap import AGENT_HEADER, agent_of, wrap_client

__all__ = ["AGENT_HEADER", "TESTED_VERSIONS", "agent_of", "wrap_client"]

__getattr__ = lazy_exports(
    {"AGENT_HEADER": "rllm_adapters.openai_sdk.wrap", "agent_of": "rllm_adapters.openai_sdk.wrap",
     "wrap_client": "rllm_adapters.openai_sdk.wrap"},
    framework="openai", dist="openai", tested=TESTED_VERSIONS, extra=None, adapter="openai_sdk",
)
