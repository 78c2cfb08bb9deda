"""Role trajectories for multi-agent workflows.

Several agents can play the same role in one episode (N solvers, two debaters). Each makes its calls under
its own agent name (`solver#0`, `solver#1`) so the gateway keeps their steps apart; afterwards the
trajectories are renamed to the role (`solver`) with the agent name and that agent's answer in metadata.
Training then groups all solvers of a task together, and the engine grades each `answer` separately, so a
solver and the judge that picked it get their own rewards.
"""

from __future__ import annotations

from typing import Any

from rllm_core.types import Episode, Task
from rllm_rollout.rollout import Rollout

__all__ = ["ROLES_KEY", "RoleRollout", "assign_roles"]

ROLES_KEY = "roles"
"""The rollout returns artifacts[ROLES_KEY] = {agent name: {"role": ..., "answer": ..., ...}}."""


def assign_roles(episode: Episode) -> Episode:
    roles: dict[str, dict[str, Any]] = episode.artifacts.pop(ROLES_KEY, None) or {}
    for traj in episode.trajectories:
        spec = roles.get(traj.name)
        if spec is None:
            continue
        traj.metadata.update({"agent": traj.name, **{k: v for k, v in spec.items() if k != "role"}})
        traj.name = str(spec.get("role", traj.name))
    return episode


class RoleRollout(Rollout):
    """A rollout whose trajectories are renamed from agent names to roles once the episode is built. `roles` names
    the roles it plays, so per-role options (--estimator, --roles) can be checked before anything runs."""

    def __init__(self, fn: Any, name: str | None = None, roles: tuple[str, ...] = ()) -> None:
        super().__init__(fn, name=name)
        self.roles = tuple(roles)

    async def arun(self, task: Task | dict[str, Any], **kwargs: Any) -> Episode:  # type: ignore[override]
        return assign_roles(await super().arun(task, **kwargs))
