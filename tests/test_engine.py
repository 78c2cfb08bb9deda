"""run_episodes through the real gateway against the fake upstream: order, scores, reasons, crash isolation."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from rllm_core.types import Episode, Task
from rllm_envs.benchmarks import get_benchmark
from rllm_rollout.engine import episode_token_counts, run_episodes
from rllm_rollout.rollout import RolloutConfig, rollout
from rllm_testing.fake_upstream import start_fake_upstream


def _arith_responder(body: dict[str, Any]) -> str:
    """Right for even first operands, wrong for odd ones; long-winded when the prompt says 'ramble'."""
    text = body["messages"][-1]["content"]
    a, op, b = re.search(r"What is (\d+) ([-+*]) (\d+)", text).groups()  # type: ignore[union-attr]
    value = eval(f"{a}{op}{b}")
    return str(value if int(a) % 2 == 0 else value + 1)


async def test_run_episodes_scores_in_task_order() -> None:
    bench = get_benchmark("arithmetic")
    tasks = bench.load("train", max_examples=6)
    seen: list[Episode] = []
    with start_fake_upstream(_arith_responder) as up:
        eps = await run_episodes(bench.default_rollout(), tasks, base_url=up.base_url, model="fake",
                                 attempts=2, concurrency=4, benchmark=bench, progress=False,
                                 sampling={"temperature": 0.0, "max_tokens": 16}, on_episode=seen.append)
    assert len(eps) == 12 and len(seen) == 12
    assert [e.task.id for e in eps] == [t.id for t in tasks for _ in range(2)]
    assert [e.attempt for e in eps[:2]] == [0, 1]
    for ep in eps:
        want = ep.task.metadata["a"] % 2 == 0
        assert ep.is_correct is want and ep.reward == float(want)
        assert ep.reward_reason == ("correct" if want else "wrong_answer")
        (step,) = ep.steps
        assert step.trainable and step.params.get("max_tokens") == 16
        assert ep.trajectories[0].name == "solver"
        assert episode_token_counts(ep)[1] == len(step.completion_token_ids or [])


async def test_crash_timeout_and_truncation_are_recorded_not_raised() -> None:
    bench = get_benchmark("arithmetic")
    tasks = bench.load("test", max_examples=3)

    @rollout(name="flaky")
    async def flaky(task: Task, config: RolloutConfig) -> Any:
        from rllm_rollout.chat import chat, make_client, task_messages

        index = int(task.id.rsplit(":", 1)[1])
        if index == 0:
            raise RuntimeError("agent bug")
        if index == 1:
            await asyncio.sleep(5)
        async with make_client(config) as client:
            return {"answer": (await chat(client, config, task_messages(task), max_tokens=2)).text}

    with start_fake_upstream(lambda body: "the answer is 12345") as up:
        eps = await run_episodes(flaky, tasks, base_url=up.base_url, benchmark=bench, timeout_s=0.5,
                                 progress=False)
    reasons = [e.reward_reason for e in eps]
    assert reasons == ["error", "timeout", "truncated"]
    assert "agent bug" in (eps[0].error or "")
    assert all(e.reward == 0.0 and e.is_correct is False for e in eps)


async def test_unscored_without_benchmark(fake_upstream: Any) -> None:
    tasks = [Task(id="t1", instruction="hello")]
    eps = await run_episodes(get_benchmark("gsm8k").default_rollout(), tasks, base_url=fake_upstream.base_url,
                             progress=True)
    assert eps[0].reward is None and eps[0].artifacts["answer"].startswith("ok: hello")
