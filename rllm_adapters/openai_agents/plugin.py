"""The rllm plugin of the OpenAI Agents SDK adapter: registers its AdapterSpec and joins its call records."""

from __future__ import annotations

from typing import Any

from rllm_adapters._common import call_log
from rllm_core.adapters import AdapterSpec
from rllm_core.hookspecs import hookimpl

__all__ = ["TESTED_VERSIONS", "rllm_on_episode_end", "rllm_register_adapters"]

TESTED_VERSIONS = ">=0.24,<0.25"
"""openai-agents versions the adapter was tested with."""


@hookimpl
def rllm_register_adapters() -> list[AdapterSpec]:
    return [AdapterSpec(
        name="openai_agents", module="rllm_adapters.openai_agents", framework="openai-agents",
        extra="openai-agents", tested_versions=TESTED_VERSIONS,
        description="install() / run_config(): chat completions, offline tracing, one trajectory per agent",
    )]


@hookimpl
def rllm_on_episode_end(episode: Any) -> None:
    call_log.join(episode, framework="openai_agents")
