"""An AutoGen AgentChat team that `rllm train` trains as it is: a solver proposes, a checker reviews and answers.

An ordinary RoundRobinGroupChat of two AssistantAgents on one OpenAI-compatible model client: `solver` works
the problem out, `checker` re-checks it and gives the final answer; the chat ends after the checker's reply
(`ROUNDS` solver/checker exchanges). Built for arithmetic / gsm8k-style tasks: the episode's answer is the
checker's last message, graded by the benchmark (the last number in it, for `arithmetic`).

The only rllm lines are in the rollout function `team` at the bottom: it points the model client at the episode's
gateway session (`config.base_url`, a placeholder key as with vLLM, `model_info` because AutoGen refuses a model
name it does not know, such as a local model's), samples with the run's settings (`config.sampling`, a seed per
agent from `config.call_seed`), and wraps the team with `rllm_adapters.autogen.wrap_team`, which names every call
after the agent that made it. So each episode has two trajectories, "solver" and "checker", and training sees them
as two roles (`--algo` may map each role to its own estimator in a config file).

    rllm train arithmetic --agent examples/agents/autogen_team.py:team --max-steps 20
    rllm eval arithmetic --agent examples/agents/autogen_team.py:team --max-examples 20
"""

from __future__ import annotations

from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.models import ChatCompletionClient, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

import rllm
from rllm_adapters.autogen import wrap_team

ROUNDS = 1
"""Solver/checker exchanges: the chat is the task message plus 2 * ROUNDS replies, the last one the checker's."""
SOLVER = ("You solve math problems. Work the problem out briefly, then end with the final answer as "
          "'Answer: <number>'.")
CHECKER = ("You check another agent's solution to a math problem. Recompute the result yourself; if the solution "
           "is wrong, say what is wrong. End with the correct final answer as 'Answer: <number>'.")
MODEL_INFO: ModelInfo = {"vision": False, "function_calling": False, "json_output": False, "family": "unknown",
                         "structured_output": False}
"""What the model can do, for a model name AutoGen does not know (it refuses to guess)."""


def build_team(solver_client: ChatCompletionClient, checker_client: ChatCompletionClient) -> RoundRobinGroupChat:
    """solver -> checker (-> solver -> checker ...), ending on the checker's reply."""
    solver = AssistantAgent("solver", model_client=solver_client, system_message=SOLVER)
    checker = AssistantAgent("checker", model_client=checker_client, system_message=CHECKER)
    return RoundRobinGroupChat([solver, checker], termination_condition=MaxMessageTermination(1 + 2 * ROUNDS))


async def solve(team: RoundRobinGroupChat, problem: str) -> dict[str, Any]:
    """Run the chat; the checker's last message is the answer."""
    result = await team.run(task=problem)
    replies = [m for m in result.messages if getattr(m, "source", None) == "checker"]
    final = replies[-1].to_text() if replies else ""
    return {"answer": final, "messages": len(result.messages), "stop_reason": result.stop_reason}


@rllm.rollout(name="autogen_team")
async def team(task: rllm.Task, config: rllm.RolloutConfig) -> dict[str, Any]:
    sampling = config.sampling

    def client(index: int) -> OpenAIChatCompletionClient:
        args: dict[str, Any] = {k: sampling[k] for k in ("temperature", "max_tokens", "top_p")
                                if sampling.get(k) is not None}
        if (seed := config.call_seed(index)) is not None:
            args["seed"] = seed
        return OpenAIChatCompletionClient(model=config.model, base_url=config.base_url, api_key="EMPTY",
                                          model_info=MODEL_INFO, max_retries=0, **args)

    clients = [client(0), client(1)]
    try:
        chat = wrap_team(build_team(*clients))  # each agent's calls -> the trajectory of its name
        return await solve(chat, str(task.instruction))
    finally:
        for c in clients:
            await c.close()
