"""The default rollout of single-answer benchmarks: send the instruction, return the reply as the answer.

Its one call carries the episode's call seed (`config.call_seed(0)`; none when the run is unseeded), so a
seeded training run samples the same completions on every rerun and resume.
"""

from __future__ import annotations

from typing import Any

from rllm_core.types import Task
from rllm_rollout.chat import chat, make_client, task_messages
from rllm_rollout.rollout import RolloutConfig, rollout

__all__ = ["single_turn"]


@rollout(name="solver")
async def single_turn(task: Task, config: RolloutConfig) -> dict[str, Any]:
    async with make_client(config) as client:
        reply = await chat(client, config, task_messages(task), seed=config.call_seed(0))
    return {"answer": reply.text, "finish_reason": reply.finish_reason}
