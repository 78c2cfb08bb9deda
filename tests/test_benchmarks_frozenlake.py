"""FrozenLake's multi-turn default rollout through the gateway: observation, move, next observation."""

from __future__ import annotations

from typing import Any

from rllm_envs.benchmarks import get_benchmark
from rllm_envs.benchmarks.frozenlake import ACTIONS, solve
from rllm_rollout.engine import run_episodes
from rllm_testing.fake_upstream import start_fake_upstream


def _planner(body: dict[str, Any]) -> str:
    """Plays the shortest path: the map in the latest observation shows where P is."""
    messages = body["messages"]
    board = [ln for ln in str(messages[-1]["content"]).splitlines() if ln and set(ln) <= set("SFHGP")]
    desc = [row.replace("S", "F").replace("P", "S") for row in board]  # plan from where P stands
    path = solve(desc) or [0]
    return f"I will go {ACTIONS[path[0]]}"


async def test_frozenlake_multi_turn_reaches_goal() -> None:
    bench = get_benchmark("frozenlake")
    tasks = bench.load("test", max_examples=2)
    with start_fake_upstream(_planner) as up:
        eps = await run_episodes(bench.default_rollout(), tasks, base_url=up.base_url, benchmark=bench,
                                 progress=False)
    for ep, task in zip(eps, tasks, strict=True):
        assert ep.reward_reason == "correct" and ep.reward == 1.0
        steps = ep.trajectory("player").steps
        assert len(steps) == len(task.ground_truth) == len(ep.artifacts["actions"])
        # each turn's prompt extends the previous conversation (merged into one training sequence later)
        assert len(steps[-1].messages or []) == 2 * len(steps) - 1


async def test_frozenlake_invalid_moves_are_format_errors() -> None:
    bench = get_benchmark("frozenlake")
    tasks = bench.load("test", max_examples=1)
    with start_fake_upstream(lambda body: "I am not sure") as up:
        (ep,) = await run_episodes(bench.default_rollout(), tasks, base_url=up.base_url, benchmark=bench,
                                   progress=False)
    assert ep.reward_reason == "format_error" and ep.artifacts["invalid_moves"] == tasks[0].metadata["max_turns"]


def test_no_held_out_map_is_a_training_task_on_4x4() -> None:
    """Random 4x4 maps repeat (499 distinct in 1,000 draws): the train split skips the test split's maps, so a
    trained policy is measured on maps it never played; the train split keeps its size."""
    bench = get_benchmark("frozenlake")
    held_out = {tuple(t.metadata["desc"]) for t in bench.load("test")}
    train = bench.load("train")
    assert len(train) == 1000 and not any(tuple(t.metadata["desc"]) in held_out for t in train)
    assert [t.id for t in bench.load("train", max_examples=3)] == [t.id for t in train[:3]]
