"""The built-in `terminal` benchmark: 34 shell tasks written for rllm, in Harbor's task format, in three tiers.

The tasks live in `rllm_envs/terminal/tasks/` (shipped in the wheel as package data), one Harbor task directory
each, and run in any sandbox provider (default `local`: bubblewrap on the host's read-only system, so their
Dockerfiles are only `FROM` / `WORKDIR` / `COPY`; the tools they use are bash, coreutils, grep, sed, awk, find,
tar, gzip, make, python3 and git):

- tier 1, `difficulty = "easy"`: files and text processing (count, rename, extract a column, permissions,
  de-duplicate, archive...);
- tier 2, `"medium"`: scripting and data wrangling (JSON to CSV, log aggregation, write a script checked on
  hidden inputs, fix a Makefile, joins, config edits...);
- tier 3, `"hard"`: git (commit, branch, revert, resolve a merge conflict, tag, search history) and debugging
  small programs (fix failing unit tests, a CSV parser, a shell script that breaks on spaces, a slow program).

Every verifier judges only the end state of files under /app, and every task is checked (tests/
test_terminal_tasks.py) to score 1.0 with its oracle and 0.0 with an agent that does nothing.

Splits: `test` is every task (what `rllm eval terminal` runs, and what the oracle/nop validation covers).
`train` and `heldout` partition them: a task is held out when its task.toml says `[metadata] split = "heldout"`
(else it is a training task). The assignment is written into each task, every third task of each tier by id
(12 held out, 4 per tier; 22 train), so it never shifts when tasks are added. `rllm train terminal` trains on
`train` and validates on `heldout` (its `train_defaults`): tasks it never trained on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from rllm_envs.harbor.benchmark import HarborBenchmark
from rllm_envs.harbor.task import HarborTask, load_tasks

__all__ = ["TASKS_DIR", "TIERS", "TerminalBenchmark", "is_heldout", "tier_of"]

TASKS_DIR = Path(__file__).parent / "tasks"
TIERS: Mapping[str, int] = {"easy": 1, "medium": 2, "hard": 3}
"""task.toml `[metadata] difficulty` -> tier."""


def is_heldout(task: HarborTask) -> bool:
    """Whether a task belongs to the `heldout` split (else `train`): its own `[metadata] split`."""
    return task.metadata.get("split") == "heldout"


def tier_of(task: HarborTask) -> int:
    """The task's tier (1-3) from its difficulty; 0 when it has none this set knows."""
    return TIERS.get(str(task.metadata.get("difficulty", "")), 0)


class TerminalBenchmark(HarborBenchmark):
    """`terminal`: the built-in shell tasks (module docstring), verified in a sandbox."""

    splits: tuple[str, ...] = ("test", "train", "heldout")
    train_defaults: ClassVar[Mapping[str, Any]] = {"train_split": "train", "val_split": "heldout"}

    def __init__(self, path: str | Path | None = None) -> None:
        super().__init__(path or TASKS_DIR, name="terminal",
                         description="34 built-in shell tasks in 3 tiers (files/text, scripting/data, "
                                     "git/debugging), verified in a sandbox")
        self.source = "rllm_envs/terminal/tasks (built in, Harbor format)"

    def harbor_tasks(self, split: str = "test") -> list[HarborTask]:
        """Every task for `test`; the tasks marked for `train` / `heldout` (module docstring)."""
        self._check_split(split)
        tasks = load_tasks(self.path)
        if split == "test":
            return tasks
        return [t for t in tasks if is_heldout(t) == (split == "heldout")]

    def to_task(self, htask: HarborTask, split: str = "test") -> Any:
        task = super().to_task(htask, split)
        task.metadata["tier"] = tier_of(htask)
        return task
