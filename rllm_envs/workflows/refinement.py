"""Iterative refinement: answer, critique, revise — N rounds, with credit for every turn.

Each turn is its own trajectory, graded on its own answer by the engine (as solver-judge's roles are):

    solver  turn 0 (the first answer), turn k (the k-th revision)   graded on that turn's answer
    critic  round k (reviews solver turn k-1)                      graded on the answer its critique ends with

Graded only by the final answer, a right first answer that a revision spoiled earned nothing, a critic was paid
for the solver's revision rather than its own judgement, and a revision that fixed a wrong answer shared its
credit with the answer it fixed. Now a right first answer is rewarded even if a revision spoils it, and a revision
is rewarded for what it answers. The critic ends its critique with the answer it holds to be right (the one it
reviewed if it found no mistake, its correction otherwise), so it earns credit for catching a mistake or confirming
a right answer, and none for passing a wrong one or "correcting" a right one. The episode's reward is still the
final answer's.

A revision sees the whole conversation so far (its answers, each critique as the next user turn), so the policy
learns to revise in context; it trains on its own completion only, with its own advantage. All solver turns of a
task's attempts form one group (as solver-judge's N solvers do), the critics another. With a seeded run each call
sends its own seed (`config.call_seed`), so the workflow repeats exactly.
"""

from __future__ import annotations

from typing import Any

from rllm_core.context import agent_scope
from rllm_core.roles import agent_name
from rllm_core.types import Task
from rllm_envs.workflows.roles import ROLES_KEY, RoleRollout
from rllm_rollout.chat import chat, make_client, task_messages, task_text
from rllm_rollout.rollout import RolloutConfig

__all__ = ["iterative_refinement"]

CRITIC_PROMPT = ("Problem:\n{problem}\n\nProposed answer:\n{answer}\n\nCheck the answer step by step. Point out "
                 "any mistake; if it is correct, say so. End with the final answer you believe is correct, in the "
                 "format the problem asks for.")
REVISE_PROMPT = "A reviewer commented:\n{critique}\n\nRevise your answer, keeping the same final-answer format."


def iterative_refinement(rounds: int = 1) -> RoleRollout:
    if rounds < 0:
        raise ValueError("iterative_refinement needs rounds >= 0")

    async def run(task: Task, config: RolloutConfig) -> dict[str, Any]:
        messages = task_messages(task)
        history: list[dict[str, str]] = []
        roles: dict[str, dict[str, Any]] = {}
        calls = 0

        async def ask(agent: str, prompt: list[dict[str, Any]]) -> str:
            nonlocal calls
            with agent_scope(agent):  # one agent name per turn: each turn is its own trajectory
                reply = await chat(client, config, prompt, seed=config.call_seed(calls))
            calls += 1
            return reply.text

        async with make_client(config) as client:
            answer = await ask(agent_name("solver", 0), messages)
            roles[agent_name("solver", 0)] = {"role": "solver", "answer": answer, "turn": 0}
            for r in range(1, rounds + 1):
                critique = await ask(agent_name("critic", r), [{"role": "user", "content": CRITIC_PROMPT.format(
                    problem=task_text(task), answer=answer)}])
                roles[agent_name("critic", r)] = {"role": "critic", "answer": critique, "round": r}
                history.append({"answer": answer, "critique": critique})
                messages = [*messages, {"role": "assistant", "content": answer},
                            {"role": "user", "content": REVISE_PROMPT.format(critique=critique)}]
                answer = await ask(agent_name("solver", r), messages)
                roles[agent_name("solver", r)] = {"role": "solver", "answer": answer, "turn": r}
        return {"answer": answer, "rounds": history, ROLES_KEY: roles}

    return RoleRollout(run, name="refinement", roles=("solver", "critic"))
