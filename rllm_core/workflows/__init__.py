"""Reusable multi-agent workflows over any OpenAI-compatible endpoint, each an `@rllm.rollout`.

    iterative_refinement(rounds)        answer → critique → revise     trajectories: solver, critic
    solver_judge(n_solvers)             N solvers, a judge picks        trajectories: solver ×N, judge
    self_debate(n_agents, rounds)       agents argue, moderator ends    trajectories: debater ×N, moderator
    get_workflow(name, **options)       by CLI name: refinement | solver-judge | self-debate
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.rollout import Rollout
from rllm_core.workflows.debate import self_debate
from rllm_core.workflows.refinement import iterative_refinement
from rllm_core.workflows.roles import RoleRollout, assign_roles
from rllm_core.workflows.solver_judge import solver_judge

__all__ = ["WORKFLOWS", "RoleRollout", "assign_roles", "get_workflow", "iterative_refinement", "self_debate",
           "solver_judge"]

WORKFLOWS: dict[str, Callable[..., Rollout]] = {
    "refinement": iterative_refinement,
    "solver-judge": solver_judge,
    "self-debate": self_debate,
}


def get_workflow(name: str, **options: Any) -> Rollout:
    key = name.replace("_", "-").lower()
    if key not in WORKFLOWS:
        raise ConfigError(f"unknown workflow {name!r}; choose one of {sorted(WORKFLOWS)}")
    return WORKFLOWS[key](**options)
