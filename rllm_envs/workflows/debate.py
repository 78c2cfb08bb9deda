"""Self-debate: two or more agents answer, read each other's answers and argue for R rounds; a moderator
then gives the final answer.

Trajectories: `debater` (one per agent, metadata `answer` = its last answer) and `moderator` (the final).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rllm_core.context import agent_scope
from rllm_core.roles import agent_name
from rllm_core.types import Task
from rllm_envs.workflows.roles import ROLES_KEY, RoleRollout
from rllm_rollout.chat import chat, make_client, task_messages, task_text
from rllm_rollout.rollout import RolloutConfig

__all__ = ["self_debate"]

DEBATE_PROMPT = ("Other agents answered:\n{others}\n\nConsider their reasoning. Do you keep or change your "
                 "answer? Give your updated answer, keeping the same final-answer format.")
MODERATOR_PROMPT = ("Problem:\n{problem}\n\nFinal answers of the debate:\n{answers}\n\nGive the single best "
                    "final answer, in the format the problem asks for.")


def self_debate(n_agents: int = 2, rounds: int = 2) -> RoleRollout:
    if n_agents < 2 or rounds < 1:
        raise ValueError("self_debate needs at least 2 agents and 1 round")

    async def run(task: Task, config: RolloutConfig) -> dict[str, Any]:
        convs = [task_messages(task) for _ in range(n_agents)]
        latest: list[str] = [""] * n_agents
        transcript: list[list[str]] = []
        async with make_client(config) as client:

            async def speak(i: int) -> str:
                with agent_scope(agent_name("debater", i)):
                    return (await chat(client, config, convs[i])).text

            for r in range(rounds):
                if r > 0:
                    for i in range(n_agents):
                        others = "\n\n".join(f"Agent {j + 1}: {latest[j]}" for j in range(n_agents) if j != i)
                        convs[i] = [*convs[i], {"role": "assistant", "content": latest[i]},
                                    {"role": "user", "content": DEBATE_PROMPT.format(others=others)}]
                latest = list(await asyncio.gather(*(speak(i) for i in range(n_agents))))
                transcript.append(list(latest))
            answers = "\n\n".join(f"Agent {i + 1}: {a}" for i, a in enumerate(latest))
            with agent_scope("moderator"):
                final = (await chat(client, config, [{"role": "user", "content": MODERATOR_PROMPT.format(
                    problem=task_text(task), answers=answers)}])).text
        roles: dict[str, dict[str, Any]] = {
            agent_name("debater", i): {"role": "debater", "answer": a, "index": i} for i, a in enumerate(latest)}
        roles["moderator"] = {"role": "moderator", "answer": final}
        return {"answer": final, "transcript": transcript, ROLES_KEY: roles}

    return RoleRollout(run, name="self_debate", roles=("debater", "moderator"))
