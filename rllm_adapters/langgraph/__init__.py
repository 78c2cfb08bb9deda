"""LangGraph adapter: the LangChain callback handler, which names calls by graph node path.

    from rllm_adapters.langgraph import RLLMCallbackHandler
    graph.invoke(inputs, config={"callbacks": [RLLMCallbackHandler()]})   # inside an @rllm.rollout function

    graph = rllm_adapters.langgraph.wrap_graph(graph)                    # same, bound once to the graph

Each node ("planner", or "researcher/agent" inside a subgraph) or named agent (`lc_agent_name`) becomes its
own Trajectory; so does each `Send` branch ("draft#0", "draft#1") and each tool that asks a model
("tools:ask_expert"). Needs `pip install "rllm[langgraph]"`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllm_adapters._common import lazy_exports
from rllm_adapters.langgraph.plugin import TESTED_VERSIONS

if TYPE_CHECKING:
    from rllm_adapters.langchain.global_hook import install, uninstall
    from rllm_adapters.langchain.handler import RLLMCallbackHandler
    from rllm_adapters.langgraph.wrap import wrap_graph

__all__ = ["TESTED_VERSIONS", "RLLMCallbackHandler", "install", "uninstall", "wrap_graph"]

__getattr__ = lazy_exports(
    {"RLLMCallbackHandler": "rllm_adapters.langchain.handler", "install": "rllm_adapters.langchain.global_hook",
     "uninstall": "rllm_adapters.langchain.global_hook", "wrap_graph": "rllm_adapters.langgraph.wrap"},
    framework="langgraph", dist="langgraph", tested=TESTED_VERSIONS, extra="langgraph", adapter="langgraph",
)
