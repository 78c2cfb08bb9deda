"""Iterative refinement: answer, critique, revise — N rounds.

The solver keeps one growing conversation (answer, critique as the next user turn, revision), so its
steps merge into one training sequence; the critic's calls form the `critic` trajectory.
"""

from __future__ import annotations

from typing import Any

from rllm_core.context import agent_scope
from rllm_core.rollout import Rollout, RolloutConfig
from rllm_core.types import Task
from rllm_core.workflows.chat import chat, make_client, task_messages, task_text

__all__ = ["iterative_refinement"]

CRITIC_PROMPT = ("Problem:\n{problem}\n\nProposed answer:\n{answer}\n\nCheck the answer step by step. Point out "
                 "any mistake; if it is correct, say so.")
REVISE_PROMPT = "A reviewer commented:\n{critique}\n\nRevise your answer, keeping the same final-answer format."


def iterative_refinement(rounds: int = 1) -> Rollout:
    if rounds < 0:
        raise ValueError("iterative_refinement needs rounds >= 0")

    async def run(task: Task, config: RolloutConfig) -> dict[str, Any]:
        messages = task_messages(task)
        history: list[dict[str, str]] = []
        async with make_client(config) as client:
            with agent_scope("solver"):
                answer = (await chat(client, config, messages)).text
            for _ in range(rounds):
                with agent_scope("critic"):
                    critique = (await chat(client, config, [{"role": "user", "content": CRITIC_PROMPT.format(
                        problem=task_text(task), answer=answer)}])).text
                history.append({"answer": answer, "critique": critique})
                messages = [*messages, {"role": "assistant", "content": answer},
                            {"role": "user", "content": REVISE_PROMPT.format(critique=critique)}]
                with agent_scope("solver"):
                    answer = (await chat(client, config, messages)).text
        return {"answer": answer, "rounds": history}

    return Rollout(run, name="refinement")
