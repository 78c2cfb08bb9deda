"""Reusable multi-agent workflows over any OpenAI-compatible endpoint, each an `@rllm.rollout`.

    iterative_refinement(rounds)        answer → critique → revise     trajectories: solver, critic
    solver_judge(n_solvers)             N solvers, a judge picks        trajectories: solver ×N, judge
    self_debate(n_agents, rounds)       agents argue, moderator ends    trajectories: debater ×N, moderator
    get_workflow(name, **options)       by CLI name: refinement | solver-judge | self-debate, options
                                        as keywords or in the name ('self-debate:n_agents=3,rounds=1')
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rllm_core.errors import ConfigError
from rllm_envs.workflows.debate import self_debate
from rllm_envs.workflows.refinement import iterative_refinement
from rllm_envs.workflows.roles import RoleRollout, assign_roles
from rllm_envs.workflows.solver_judge import solver_judge
from rllm_rollout.rollout import Rollout

__all__ = ["WORKFLOWS", "RoleRollout", "assign_roles", "get_workflow", "iterative_refinement", "self_debate",
           "solver_judge"]

WORKFLOWS: dict[str, Callable[..., Rollout]] = {
    "refinement": iterative_refinement,
    "solver-judge": solver_judge,
    "self-debate": self_debate,
}


def _parse_options(spec: str) -> dict[str, int]:
    options: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ConfigError(f"workflow option {item!r} must look like name=INTEGER (e.g. n_solvers=3)")
        options[key.strip()] = int(value)
    return options


def get_workflow(name: str, **options: Any) -> Rollout:
    """A workflow by CLI name, with options as keywords or in the name: 'solver-judge:n_solvers=3'."""
    base, _, spec = name.partition(":")
    key = base.strip().replace("_", "-").lower()
    if key not in WORKFLOWS:
        raise ConfigError(f"unknown workflow {name!r}; choose one of {sorted(WORKFLOWS)}")
    factory = WORKFLOWS[key]
    options = {**_parse_options(spec), **options}
    accepted = list(inspect.signature(factory).parameters)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(f"workflow {key!r} has no option {', '.join(unknown)}; its options are {accepted}")
    try:
        return factory(**options)
    except ValueError as exc:
        raise ConfigError(f"workflow {name!r}: {exc}") from None
