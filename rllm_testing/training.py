"""Test doubles for the training loop: a tiny benchmark whose answers a fake upstream can get right or wrong.

`YesNoBenchmark` asks "answer yes" questions and grades "yes" as correct; `alternating_responder` makes the
fake upstream answer yes, no, yes, no... *per question*, so every group of even size has mixed rewards (a
learning signal) whatever order the concurrent attempts reach the upstream in.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["YesNoBenchmark", "alternating_responder", "yesno_config"]


class YesNoBenchmark(Benchmark):
    name = "yesno"
    category = "test"
    reward = "exact"
    splits = ("train", "test")

    def __init__(self, n_train: int = 6, n_test: int = 2, reward: str = "exact") -> None:
        self.sizes = {"train": n_train, "test": n_test}
        self.reward = reward

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        n = self.sizes[split] if max_examples is None else min(max_examples, self.sizes[split])
        return [self._task(i, split, f"question {i}: answer yes", "yes") for i in range(n)]

    def grade(self, task: Task, response: str) -> RewardResult:
        if "yes" in response:
            return RewardResult.correct(extracted="yes")
        return RewardResult.fail("wrong_answer", extracted=response[:20])


def alternating_responder() -> Any:
    """A fake-upstream responder: consecutive calls with the same messages answer yes, no, yes, no..."""
    calls: Counter[str] = Counter()

    def respond(body: dict[str, Any]) -> str:
        key = json.dumps(body.get("messages") or body.get("prompt"), sort_keys=True)
        calls[key] += 1
        return "yes" if calls[key] % 2 == 1 else "no"

    return respond


def yesno_config(tmp_path: Path, **overrides: Any) -> Any:
    """A TrainConfig for short loop tests on YesNoBenchmark: 2 tasks × 2 attempts, 3 steps, 8 tokens, run dir
    `tmp_path/run`; `overrides` replace any of it."""
    from rllm_train.config import TrainConfig

    base: dict[str, Any] = {"benchmark": "yesno", "batch_size": 2, "group_size": 2, "max_steps": 3,
                            "save_every": 2, "eval_examples": 2, "output": str(tmp_path / "run"),
                            "max_tokens": 8, "concurrency": 4}
    return TrainConfig(**{**base, **overrides})
