"""FrozenLake (gymnasium) as a multi-turn environment: see the map and your position, act, observe, repeat.

The agent gets the rendered map with its position marked `P`, replies with one move (LEFT, DOWN, RIGHT,
UP), and gets the next observation, until it reaches the goal (reward 1), falls in a hole, or runs out of
turns. The lake is deterministic (`is_slippery=False`) so a plan can be checked, and maps are generated
from a seed per split. `grade` replays the moves found in a text answer, so a one-shot plan is scored by
the same environment the multi-turn rollout plays.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from rllm_core.benchmarks.base import Benchmark
from rllm_core.errors import BenchmarkError
from rllm_core.rewards.types import RewardResult
from rllm_core.rollout import Rollout, RolloutConfig, rollout
from rllm_core.types import Episode, Task
from rllm_core.workflows.chat import chat, make_client

__all__ = ["ACTIONS", "FrozenLake", "parse_action", "play", "solve"]

ACTIONS = ("LEFT", "DOWN", "RIGHT", "UP")
_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
_ROWS = {"train": 1000, "test": 100}
SYSTEM = ("You are playing FrozenLake. The map uses S (start), F (frozen, safe), H (hole: you lose), G (goal) and "
          "P (you). Reach G without stepping on H. Each turn, reply with exactly one move: LEFT, DOWN, RIGHT or UP.")


def _make_env(desc: list[str]) -> Any:
    try:
        import gymnasium as gym
    except ImportError as exc:
        raise BenchmarkError("frozenlake needs gymnasium: pip install 'rllm[bench]'") from exc
    return gym.make("FrozenLake-v1", desc=desc, is_slippery=False)


def render(desc: list[str], state: int) -> str:
    n = len(desc[0])
    rows = [list(r) for r in desc]
    rows[state // n][state % n] = "P"
    return "\n".join("".join(r) for r in rows)


def parse_action(text: str) -> int | None:
    """The last move word in the reply (case-insensitive), or None."""
    found = re.findall(r"\b(LEFT|DOWN|RIGHT|UP)\b", text or "", flags=re.IGNORECASE)
    return ACTIONS.index(found[-1].upper()) if found else None


def solve(desc: list[str]) -> list[int] | None:
    """A shortest safe path (BFS), as actions; None when the goal cannot be reached."""
    n_rows, n_cols = len(desc), len(desc[0])
    start = next((r, c) for r in range(n_rows) for c in range(n_cols) if desc[r][c] == "S")
    prev: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cur = queue.popleft()
        if desc[cur[0]][cur[1]] == "G":
            path: list[int] = []
            while prev[cur] is not None:
                cur, action = prev[cur]  # type: ignore[misc]
                path.append(action)
            return path[::-1]
        for action, (dr, dc) in _MOVES.items():
            nxt = (cur[0] + dr, cur[1] + dc)
            if 0 <= nxt[0] < n_rows and 0 <= nxt[1] < n_cols and nxt not in prev and desc[nxt[0]][nxt[1]] != "H":
                prev[nxt] = (cur, action)
                queue.append(nxt)
    return None


def play(desc: list[str], actions: list[int], max_turns: int) -> dict[str, Any]:
    """Replay moves in the environment; the artifacts a FrozenLake episode is scored from."""
    env = _make_env(desc)
    state, _ = env.reset(seed=0)
    reward, outcome, taken = 0.0, "max_turns", []
    for action in actions[:max_turns]:
        state, r, terminated, truncated, _ = env.step(action)
        taken.append(ACTIONS[action])
        reward += float(r)
        if terminated or truncated:
            outcome = "goal" if r > 0 else "hole"
            break
    env.close()
    return {"env_reward": reward, "reached_goal": reward > 0, "outcome": outcome, "actions": taken,
            "final_state": int(state)}


class FrozenLake(Benchmark):
    category = "game"
    reward = "environment"
    splits = ("train", "test")
    source = "gymnasium FrozenLake-v1 (is_slippery=False), generated maps"

    def __init__(self, size: int = 4, name: str | None = None) -> None:
        self.size = size
        self.name = name or ("frozenlake" if size == 4 else f"frozenlake-{size}x{size}")
        self.max_turns = 4 * size
        self.description = f"FrozenLake {size}x{size}, multi-turn"

    def rows(self, split: str = "test") -> int | None:
        return _ROWS[split]

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        n = max_examples if max_examples is not None else _ROWS[split]
        base = seed * 100_003 + (50_000 if split == "test" else 0)
        tasks = []
        for i in range(n):
            desc = generate_random_map(size=self.size, p=0.8, seed=base + i)
            path = solve(desc) or []
            intro = f"{SYSTEM}\n\nMap:\n{render(desc, 0)}\n\nYour move?"
            tasks.append(self._task(i, split, intro, [ACTIONS[a] for a in path], desc=desc,
                                    max_turns=self.max_turns))
        return tasks

    def grade(self, task: Task, response: str) -> RewardResult:
        """Grade a one-shot plan: every move word in the response, in order, replayed in the environment."""
        moves = [ACTIONS.index(m.upper()) for m in re.findall(r"\b(LEFT|DOWN|RIGHT|UP)\b", response or "", re.I)]
        if not moves:
            return RewardResult.fail("no_answer_extracted")
        return self._result(play(task.metadata["desc"], moves, int(task.metadata["max_turns"])))

    @staticmethod
    def _result(art: dict[str, Any]) -> RewardResult:
        extracted = " ".join(art.get("actions", []))
        if art.get("reached_goal"):
            return RewardResult.correct(extracted, outcome="goal")
        if art.get("outcome") == "format" or (not art.get("actions") and art.get("invalid_moves")):
            return RewardResult.fail("format_error", extracted, outcome=art.get("outcome"))
        return RewardResult.fail("wrong_answer", extracted, outcome=art.get("outcome"))

    def score(self, task: Task, episode: Episode) -> RewardResult:
        if "outcome" in episode.artifacts and episode.error is None:
            return self._result(episode.artifacts)
        return super().score(task, episode)

    def reference_response(self, task: Task) -> str:
        return " ".join(task.ground_truth)

    def default_rollout(self) -> Rollout:
        return frozenlake_agent


@rollout(name="player")
async def frozenlake_agent(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """Multi-turn: the conversation grows each turn (observation, move), so turns merge into one sequence."""
    desc: list[str] = task.metadata["desc"]
    max_turns = int(task.metadata.get("max_turns", 16))
    env = _make_env(desc)
    state, _ = env.reset(seed=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task.instruction)}]
    taken: list[str] = []
    reward, outcome, invalid, last = 0.0, "max_turns", 0, ""
    async with make_client(config) as client:
        for _ in range(max_turns):
            reply = await chat(client, config, messages)
            last = reply.text
            messages.append({"role": "assistant", "content": reply.text})
            action = parse_action(reply.text)
            if action is None:
                invalid += 1
                messages.append({"role": "user", "content": "Invalid move. Reply with one of LEFT, DOWN, RIGHT, UP."})
                continue
            state, r, terminated, truncated, _ = env.step(action)
            taken.append(ACTIONS[action])
            reward += float(r)
            if terminated or truncated:
                outcome = "goal" if r > 0 else "hole"
                break
            observation = f"You moved {ACTIONS[action]}.\n{render(desc, int(state))}\n\nYour move?"
            messages.append({"role": "user", "content": observation})
    env.close()
    if not taken and invalid:
        outcome = "format"
    return {"answer": last, "env_reward": reward, "reached_goal": reward > 0, "outcome": outcome,
            "actions": taken, "invalid_moves": invalid, "turns": len(taken) + invalid}
