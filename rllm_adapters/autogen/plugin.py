"""The rllm plugin of the AutoGen adapter: registers its AdapterSpec and joins its call records."""

from __future__ import annotations

from typing import Any

from rllm_adapters._common import call_log
from rllm_core.adapters import AdapterSpec
from rllm_core.hookspecs import hookimpl

__all__ = ["TESTED_VERSIONS", "rllm_on_episode_end", "rllm_register_adapters"]

TESTED_VERSIONS = ">=0.7,<0.8"
"""autogen-agentchat versions the adapter was tested with."""


@hookimpl
def rllm_register_adapters() -> list[AdapterSpec]:
    return [AdapterSpec(
        name="autogen", module="rllm_adapters.autogen", framework="autogen-agentchat", extra="autogen",
        tested_versions=TESTED_VERSIONS,
        description="wrap_team(): one trajectory per agent (RoundRobin / Selector group chats, single agents)",
    )]


@hookimpl
def rllm_on_episode_end(episode: Any) -> None:
    call_log.join(episode, framework="autogen")
