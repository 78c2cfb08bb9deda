"""The adapter seam: a plugin that captures an agent framework's LLM calls says so with an AdapterSpec.

Capture itself needs no registration (the gateway and in-process capture record any OpenAI-compatible call);
an adapter adds what a framework knows about its calls (LangGraph node names, AutoGen agent names) and is
listed by `rllm plugins` with the framework versions it was tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

from rllm_core.plugins import PluginManager, get_plugin_manager

__all__ = ["AdapterSpec", "get_adapters"]


@dataclass(frozen=True)
class AdapterSpec:
    """An agent-framework adapter: where it lives, which extra installs it, which versions were tested."""

    name: str
    module: str
    framework: str
    extra: str | None = None
    tested_versions: str | None = None
    description: str = ""


def get_adapters(pm: PluginManager | None = None) -> list[AdapterSpec]:
    """Every registered adapter, in call order (`rllm_register_adapters`)."""
    return (pm or get_plugin_manager()).collect("rllm_register_adapters")
