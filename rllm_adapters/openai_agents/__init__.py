"""OpenAI Agents SDK adapter: its Responses API (or chat completions) captured, no trace export, one Trajectory
per agent.

    from rllm_adapters.openai_agents import run_config
    result = await Runner.run(agent, task.instruction, run_config=run_config(config))   # in @rllm.rollout

`run_config` calls `install()` (process-wide, idempotent); call `install()` yourself when the agent builds
its own models. Needs `pip install "rllm[openai-agents]"`; the names below import the SDK on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllm_adapters._common import lazy_exports
from rllm_adapters.openai_agents.plugin import TESTED_VERSIONS

if TYPE_CHECKING:
    from rllm_adapters.openai_agents.setup import install, installed_processor, run_config
    from rllm_adapters.openai_agents.tracing import RLLMTracingProcessor

__all__ = ["TESTED_VERSIONS", "RLLMTracingProcessor", "install", "installed_processor", "run_config"]

__getattr__ = lazy_exports(
    {"RLLMTracingProcessor": "rllm_adapters.openai_agents.tracing", "install": "rllm_adapters.openai_agents.setup",
     "installed_processor": "rllm_adapters.openai_agents.setup", "run_config": "rllm_adapters.openai_agents.setup"},
    framework="agents", dist="openai-agents", tested=TESTED_VERSIONS, extra="openai-agents",
    adapter="openai_agents",
)
