"""Built-in arithmetic at graded difficulty: the task where a 135M model on CPU visibly learns.

`arithmetic` is single-digit addition (SmolLM2-135M: ~22 % sampling, ~69 % greedy). The prompt asks for just
the number and the grader takes the last number in the reply, so a tiny model's "7" or "3 + 4 = 7" both
count. Train and test are disjoint: problems are split by a fixed hash, so no test problem is trained on.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rllm_core.cpu_features import native_bf16
from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.rewards.math import grade_math
from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["LEVELS", "Arithmetic", "arithmetic_benchmarks"]

PROMPT = "What is {a} {op} {b}? Answer with just the number."


@dataclass(frozen=True)
class Level:
    name: str
    digits: tuple[int, int]
    ops: str
    description: str


LEVELS = (
    Level("arithmetic", (1, 1), "+", "single-digit addition"),
    Level("arithmetic-subtraction", (1, 1), "-", "single-digit subtraction"),
    Level("arithmetic-mixed", (1, 1), "+-*", "single-digit +, -, *"),
    Level("arithmetic-2digit", (2, 2), "+", "two-digit addition"),
    Level("arithmetic-3digit", (3, 3), "+", "three-digit addition"),
    Level("arithmetic-multidigit", (2, 4), "+-*", "2-4 digit +, -, *"),
)
_DEFAULT_ROWS = {"train": 1000, "test": 200}


def _is_test(a: int, op: str, b: int) -> bool:
    """One problem in five is a test problem, by a hash that never changes."""
    return hashlib.sha256(f"{a}{op}{b}".encode()).digest()[0] % 5 == 0


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


class Arithmetic(Benchmark):
    category = "arithmetic"
    reward = "exact_number"
    splits = ("train", "test")
    source = "built-in generator"
    # Measured with SmolLM2-135M: these settings took held-out sampled accuracy on single-digit addition from
    # 12.5 % to 96.6 % in 14 minutes (benchmarks/learning_curve.py, bf16 on a CPU with native bf16). Answers are a
    # few digits. bf16 autocast only where the CPU computes bf16 natively: without AVX512-BF16 / AMX, torch's bf16
    # matmul falls back to a scalar kernel, and one update took over 8 minutes where fp32 takes seconds.
    # Gradient checkpointing (with the heap trimmed after each step) took the main job's peak RSS from 5.8 to 4.45
    # GiB on a bf16 CPU (benchmarks/train_memory.py), with the same numbers, for ~+20 % wall time (update 4.1 ->
    # 6.5 s a step): memory a laptop can plan for is the better default for the job everyone runs first.
    @property
    def train_defaults(self) -> Mapping[str, Any]:  # type: ignore[override]
        return {"max_tokens": 12, "lr": 5e-6, "bf16": native_bf16(), "eval_every": 10, "eval_greedy": True,
                "gradient_checkpointing": True}

    def __init__(self, level: Level) -> None:
        self.level = level
        self.name = level.name
        self.description = level.description

    def _pool(self, split: str) -> list[tuple[int, str, int]] | None:
        """Every problem of a small level (single-digit: 100 per op), in the split's share; None when large."""
        if self.level.digits[1] > 1:
            return None
        return [(a, op, b) for op in self.level.ops for a in range(10) for b in range(10)
                if _is_test(a, op, b) == (split == "test")]

    def rows(self, split: str = "test") -> int | None:
        pool = self._pool(split)
        return len(pool) if pool is not None else _DEFAULT_ROWS[split]

    def _problems(self, split: str, n: int, seed: int) -> list[tuple[int, str, int]]:
        rng = random.Random(f"{self.name}:{split}:{seed}")
        pool = self._pool(split)
        if pool is not None:
            rng.shuffle(pool)
            return pool[:n]
        lo, hi = self.level.digits
        out: list[tuple[int, str, int]] = []
        seen: set[tuple[int, str, int]] = set()
        tries = 0
        while len(out) < n:
            da, db = rng.randint(lo, hi), rng.randint(lo, hi)
            a, b = rng.randrange(10 ** (da - 1), 10**da), rng.randrange(10 ** (db - 1), 10**db)
            op = rng.choice(self.level.ops)
            tries += 1
            # No repeats while the level has fresh problems (after 50 tries per wanted row, repeats are allowed).
            if _is_test(a, op, b) == (split == "test") and ((a, op, b) not in seen or tries > 50 * n):
                seen.add((a, op, b))
                out.append((a, op, b))
        return out

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        n = max_examples if max_examples is not None else (self.rows(split) or 0)
        return [self._task(i, split, PROMPT.format(a=a, op=op, b=b), str(_value(a, op, b)), a=a, op=op, b=b)
                for i, (a, op, b) in enumerate(self._problems(split, n, seed))]

    def grade(self, task: Task, response: str) -> RewardResult:
        return grade_math(response, task.ground_truth, "last_number")

    def reference_response(self, task: Task) -> str:
        return str(task.ground_truth)


def arithmetic_benchmarks() -> list[Arithmetic]:
    return [Arithmetic(level) for level in LEVELS]
