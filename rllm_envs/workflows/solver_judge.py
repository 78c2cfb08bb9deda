"""Solver-judge: N solvers answer independently, a judge picks the best answer.

Trajectories: `solver` (one per solver, metadata `answer`) and `judge` (metadata `answer` = the pick), so
with a benchmark each solver is rewarded for its own answer and the judge for the answer it chose.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from rllm_core.context import agent_scope
from rllm_core.roles import agent_name
from rllm_core.types import Task
from rllm_envs.workflows.roles import ROLES_KEY, RoleRollout
from rllm_rollout.chat import chat, make_client, task_messages, task_text
from rllm_rollout.rollout import RolloutConfig

__all__ = ["parse_pick", "solver_judge"]


_NAMED_PICK = re.compile(r"(?:solution|answer|candidate)\s*#?\s*(\d+)", flags=re.IGNORECASE)
_BARE_PICK = re.compile(r"^\W*(\d+)\W*$")


def parse_pick(text: str, n: int) -> int | None:
    """The judge's choice as a 0-based index: the last "Solution k" (k in 1..n), else a reply that is just
    a number; None otherwise. Other numbers in the judge's reasoning ("2 + 2 = 4") are never a pick."""
    for tok in reversed(_NAMED_PICK.findall(text or "")):
        if 1 <= int(tok) <= n:
            return int(tok) - 1
    bare = _BARE_PICK.match((text or "").strip())
    if bare and 1 <= int(bare.group(1)) <= n:
        return int(bare.group(1)) - 1
    return None


def _judge_prompt(task: Task, answers: list[str]) -> str:
    parts = [f"Problem:\n{task_text(task)}\n", "Candidate solutions:"]
    parts += [f"\nSolution {i + 1}:\n{a.strip()}" for i, a in enumerate(answers)]
    parts += [f"\nWhich solution is correct? Reply with 'Solution k' for k between 1 and {len(answers)}."]
    return "\n".join(parts)


def solver_judge(n_solvers: int = 2) -> RoleRollout:
    if n_solvers < 1:
        raise ValueError("solver_judge needs at least one solver")

    async def run(task: Task, config: RolloutConfig) -> dict[str, Any]:
        async with make_client(config) as client:

            async def solve(i: int) -> str:
                with agent_scope(agent_name("solver", i)):
                    return (await chat(client, config, task_messages(task))).text

            answers = list(await asyncio.gather(*(solve(i) for i in range(n_solvers))))
            with agent_scope("judge"):
                verdict = await chat(client, config, [{"role": "user", "content": _judge_prompt(task, answers)}])
        pick = parse_pick(verdict.text, n_solvers)
        chosen = answers[pick if pick is not None else 0]  # the episode still answers when the judge did not pick
        roles = {agent_name("solver", i): {"role": "solver", "answer": a, "index": i} for i, a in enumerate(answers)}
        # A judge that named no solution is graded on an empty answer (no_answer_extracted), not on solver 1's.
        roles["judge"] = {"role": "judge", "answer": chosen if pick is not None else "", "pick": pick,
                          "verdict": verdict.text}
        return {"answer": chosen, "candidates": answers, "pick": pick, ROLES_KEY: roles}

    return RoleRollout(run, name="solver_judge", roles=("solver", "judge"))
