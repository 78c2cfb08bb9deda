"""AutoGen adapter (autogen-agentchat / autogen-ext 0.7): one Trajectory per agent, in call order.

    from rllm_adapters.autogen import wrap_team
    team = wrap_team(RoundRobinGroupChat([solver, critic], termination_condition=...))
    await team.run(task=...)                        # inside an @rllm.rollout function

Needs `pip install "rllm[autogen]"`; the names below import AutoGen on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllm_adapters._common import lazy_exports
from rllm_adapters.autogen.plugin import TESTED_VERSIONS

if TYPE_CHECKING:
    from rllm_adapters.autogen.client import EpisodeBinding, NamedModelClient
    from rllm_adapters.autogen.wrap import adhoc_episodes, named_clients, wrap_team

__all__ = ["TESTED_VERSIONS", "EpisodeBinding", "NamedModelClient", "adhoc_episodes", "named_clients", "wrap_team"]

__getattr__ = lazy_exports(
    {"EpisodeBinding": "rllm_adapters.autogen.client", "NamedModelClient": "rllm_adapters.autogen.client",
     "adhoc_episodes": "rllm_adapters.autogen.wrap", "named_clients": "rllm_adapters.autogen.wrap",
     "wrap_team": "rllm_adapters.autogen.wrap"},
    framework="autogen_agentchat", dist="autogen-agentchat", tested=TESTED_VERSIONS, extra="autogen",
    adapter="autogen",
)
