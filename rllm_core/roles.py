"""Agents and roles: the one naming convention for several agents playing one role in an episode.

A workflow's agents make their calls under agent names (`solver#0`, `solver#1`) so the gateway keeps their
steps apart; every per-role option (estimator, reward weight, LoRA adapter, the model name the gateway sends)
is keyed by the role (`solver`). Both directions of that naming live here and nowhere else.
"""

from __future__ import annotations

import re

__all__ = ["agent_name", "role_of_agent"]

_AGENT_INDEX = re.compile(r"#\d+$")


def agent_name(role: str, index: int) -> str:
    """The name of the `index`-th agent playing `role` in an episode: `solver#1`."""
    return f"{role}#{index}"


def role_of_agent(agent: str) -> str:
    """`solver#1` → `solver`: the agents of one role are numbered within an episode."""
    return _AGENT_INDEX.sub("", agent)
