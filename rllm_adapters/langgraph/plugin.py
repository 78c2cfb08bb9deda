"""The rllm plugin of the LangGraph adapter (the handler and its call-record join live in the LangChain one)."""

from __future__ import annotations

from rllm_core.adapters import AdapterSpec
from rllm_core.hookspecs import hookimpl

__all__ = ["TESTED_VERSIONS", "rllm_register_adapters"]

TESTED_VERSIONS = ">=1.0,<2"
"""langgraph versions the adapter was tested with."""


@hookimpl
def rllm_register_adapters() -> list[AdapterSpec]:
    return [AdapterSpec(
        name="langgraph", module="rllm_adapters.langgraph", framework="langgraph", extra="langgraph",
        tested_versions=TESTED_VERSIONS,
        description="RLLMCallbackHandler / wrap_graph(): one trajectory per graph node or named agent",
    )]
