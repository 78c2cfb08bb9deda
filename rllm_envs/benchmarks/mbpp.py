"""MBPP from its one released file: `<data_dir>/mbpp/mbpp.jsonl` (all 974 rows) split by task id as its README says.

Google's release is one JSONL whose splits are task-id ranges: 1-10 the few-shot prompts, 11-510 test, 511-600
validation, 601-974 train (the Hub's `full` config holds the same rows in those four splits). A per-split file
(`<data_dir>/mbpp/<split>.jsonl`) still wins, and without either the Hub is used. Each row is graded by the
hardened code grader on every assert of its `test_list` (the prompt shows the first, as EvalPlus does), within
10 s: bigcode-evaluation-harness allows 3.0 s, which the reference of task 123 (amicable numbers below 9999, a
quadratic loop) needs 3.3 s of on this 2-core CPU; the limit guards against hangs, it is not part of the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm_core.errors import BenchmarkError
from rllm_core.types import Task
from rllm_envs.benchmarks.dataset import DatasetBenchmark
from rllm_rollout.benchmarks.data import read_rows, resolve_data_dir, split_file

__all__ = ["SPLIT_IDS", "MBPPBenchmark", "mbpp_split"]

WHOLE_FILE = "mbpp.jsonl"
SPLIT_IDS = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601), "train": range(601, 975)}


def mbpp_split(task_id: int) -> str | None:
    return next((name for name, ids in SPLIT_IDS.items() if task_id in ids), None)


class MBPPBenchmark(DatasetBenchmark):
    def _whole_file(self, data_dir: str | None = None) -> Path | None:
        try:
            root = resolve_data_dir(data_dir)
        except BenchmarkError:
            return None
        path = root / self.folder / WHOLE_FILE if root is not None else None
        return path if path is not None and path.is_file() else None

    def _local(self, split: str, data_dir: str | None = None) -> Any:
        return super()._local(split, data_dir) or self._whole_file(data_dir)

    def rows(self, split: str = "test") -> int | None:
        if super()._local(split) is None and self._whole_file() is not None:
            return len(SPLIT_IDS[split]) if split in SPLIT_IDS else None
        return super().rows(split)

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        whole = self._whole_file(data_dir)
        if split_file(resolve_data_dir(data_dir), self.folder, split) is not None or whole is None:
            return super().load(split, data_dir, max_examples, seed)
        rows = [r for r in read_rows(whole, (*self.required, "task_id")) if mbpp_split(int(r["task_id"])) == split]
        rows = rows[:max_examples] if max_examples is not None else rows
        tasks = []
        for i, row in enumerate(rows):
            try:
                instruction, gold, meta = self.convert(row)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise BenchmarkError(f"{whole}: task {row.get('task_id')} of 'mbpp' could not be read "
                                     f"({type(exc).__name__}: {exc})") from exc
            tasks.append(self._task(i, split, instruction, gold, task_id=int(row["task_id"]), **meta))
        return tasks
