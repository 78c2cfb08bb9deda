"""FrozenLake (gymnasium) as a multi-turn environment: see the map and your position, act, observe, repeat.

The agent gets the rendered map with its position marked `P`, replies with one move (LEFT, DOWN, RIGHT,
UP), and gets the next observation, until it reaches the goal (reward 1), falls in a hole, or runs out of
turns. The lake is deterministic (`is_slippery=False`) so a plan can be checked, and maps are generated
from a seed per split. `grade` replays the moves found in a text answer, so a one-shot plan is scored by
the same environment the multi-turn rollout plays.

A move is one word, so the benchmark recommends a small per-turn token budget for eval and train alike
(`MOVE_TOKENS`, its `eval_defaults` / `train_defaults`): an uncapped reply only adds rambling to a history that
grows every turn. The turn limit is `max_turns` (4 x size unless given), stored in each task's metadata (what the
agent reads; `rllm eval --max-turns N` overrides it).

When the history no longer fits the model's context, the server refuses the next call (HTTP 400) and the agent
ends the episode with outcome `context_exceeded` and `context_exceeded_at_turn`, the turn that was refused (scored
`context_exceeded`, not `error`). It asks the server rather than counting itself: only the server knows its chat
template, tokenizer and context length exactly, and refusing a prompt costs it a tokenization, no decoding.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

import openai

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_core.types import Episode, Task
from rllm_rollout.benchmarks.base import Benchmark, context_exceeded_result
from rllm_rollout.chat import chat, make_client
from rllm_rollout.engine import context_exceeded_message
from rllm_rollout.rollout import Rollout, RolloutConfig, rollout

__all__ = ["ACTIONS", "MOVE_TOKENS", "FrozenLake", "parse_action", "play", "solve"]

ACTIONS = ("LEFT", "DOWN", "RIGHT", "UP")
_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
_ROWS = {"train": 1000, "test": 100}
MOVE_TOKENS = 24
"""Completion tokens per turn that `rllm eval` / `rllm train` use here unless told otherwise. A move is one word;
the embedded SmolLM2-135M answers greedily in 10-13 tokens ("P\n\nP is the only move."), and 24 leaves room for
"I move RIGHT." plus a short reason, while a sampled ramble is cut before it can fill the context: with 24-token
replies a whole 4x4 episode (16 turns) is ~1,060 tokens in SmolLM2's chat template, an 8x8 one (32 turns) ~2,840,
past a 2,048-token context (those end `context_exceeded`). At the 512 `rllm eval` gives other benchmarks, four
rambling turns fill 2,048 tokens, and `rllm eval frozenlake -n 4` on the embedded model had 2 episodes still
decoding after 52 min; at 24 it took 4 min."""
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
    train_defaults: ClassVar[Mapping[str, Any]] = {"max_tokens": MOVE_TOKENS}
    eval_defaults: ClassVar[Mapping[str, Any]] = {"max_tokens": MOVE_TOKENS}

    def __init__(self, size: int = 4, name: str | None = None, max_turns: int | None = None) -> None:
        if max_turns is not None and max_turns < 1:
            raise BenchmarkError(f"FrozenLake max_turns must be at least 1 (got {max_turns})")
        self.size = size
        self.name = name or ("frozenlake" if size == 4 else f"frozenlake-{size}x{size}")
        self.max_turns = max_turns or 4 * size
        """Moves (LLM calls) an episode gets at most; every task carries it as `metadata["max_turns"]`."""
        self.description = f"FrozenLake {size}x{size}, multi-turn (at most {self.max_turns} turns)"

    def rows(self, split: str = "test") -> int | None:
        return _ROWS[split]

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        n = max_examples if max_examples is not None else _ROWS[split]
        held_out = self._test_maps(seed) if split == "train" and self.size >= 4 else frozenset()
        base = seed * 100_003 + (50_000 if split == "test" else 0)
        tasks: list[Task] = []
        k = 0
        while len(tasks) < n:
            desc = generate_random_map(size=self.size, p=0.8, seed=base + k)
            k += 1
            if tuple(desc) in held_out:  # a held-out map is never a training task
                continue
            path = solve(desc) or []
            intro = f"{SYSTEM}\n\nMap:\n{render(desc, 0)}\n\nYour move?"
            tasks.append(self._task(len(tasks), split, intro, [ACTIONS[a] for a in path], desc=desc,
                                    max_turns=self.max_turns))
        return tasks

    def _test_maps(self, seed: int) -> frozenset[tuple[str, ...]]:
        """The held-out split's maps. On 4x4 a random train map is one of the 100 test maps 7 times in 100 (499
        distinct among 1,000): the train split skips them. 3x3 has some 50 solvable maps in all, so its splits
        cannot be disjoint; it is a quick multi-turn check, not a held-out measure."""
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        base = seed * 100_003 + 50_000
        return frozenset(tuple(generate_random_map(size=self.size, p=0.8, seed=base + i)) for i in range(_ROWS["test"]))

    def grade(self, task: Task, response: str) -> RewardResult:
        """Grade a one-shot plan: every move word in the response, in order, replayed in the environment."""
        moves = [ACTIONS.index(m.upper()) for m in re.findall(r"\b(LEFT|DOWN|RIGHT|UP)\b", response or "", re.I)]
        if not moves:
            return RewardResult.fail("no_answer_extracted")
        return self._result(play(task.metadata["desc"], moves, int(task.metadata["max_turns"])))

    @staticmethod
    def _result(art: dict[str, Any]) -> RewardResult:
        extracted = " ".join(art.get("actions", []))
        if art.get("outcome") == "context_exceeded" and not art.get("reached_goal"):
            return RewardResult.fail("context_exceeded", extracted, outcome="context_exceeded")
        if art.get("reached_goal"):
            return RewardResult.correct(extracted, outcome="goal")
        if art.get("outcome") == "format" or (not art.get("actions") and art.get("invalid_moves")):
            return RewardResult.fail("format_error", extracted, outcome=art.get("outcome"))
        return RewardResult.fail("wrong_answer", extracted, outcome=art.get("outcome"))

    def score(self, task: Task, episode: Episode) -> RewardResult:
        if "outcome" in episode.artifacts and episode.error is None:
            return context_exceeded_result(episode, self._result(episode.artifacts))
        return super().score(task, episode)

    def reference_response(self, task: Task) -> str:
        return " ".join(task.ground_truth)

    def default_rollout(self) -> Rollout:
        return frozenlake_agent


@rollout(name="player")
async def frozenlake_agent(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """Multi-turn: the conversation grows each turn (observation, move), so turns merge into one sequence.

    Ends at the goal, in a hole, after `task.metadata["max_turns"]` turns, or when the server refuses a turn's
    prompt as longer than its context: outcome `context_exceeded`, `context_exceeded_at_turn` the refused turn
    (1-based), the turns before it kept (module docstring). Any other model error is raised (scored `error`)."""
    desc: list[str] = task.metadata["desc"]
    max_turns = int(task.metadata.get("max_turns", 16))
    env = _make_env(desc)
    state, _ = env.reset(seed=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task.instruction)}]
    taken: list[str] = []
    reward, outcome, invalid, last = 0.0, "max_turns", 0, ""
    extra: dict[str, Any] = {}
    async with make_client(config) as client:
        for turn in range(1, max_turns + 1):
            try:
                reply = await chat(client, config, messages)
            except openai.APIStatusError as exc:
                refusal = context_exceeded_message(exc)
                if refusal is None:
                    raise
                outcome = "context_exceeded"
                extra = {"context_exceeded_at_turn": turn, "context_exceeded_message": refusal[:500]}
                break
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
    if not taken and invalid and outcome == "max_turns":
        outcome = "format"
    return {"answer": last, "env_reward": reward, "reached_goal": reward > 0, "outcome": outcome,
            "actions": taken, "invalid_moves": invalid, "turns": len(taken) + invalid, "max_turns": max_turns,
            **extra}
