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

Eval and train run the agent the same way: at most `TURN_TOKENS` completion tokens a turn (its `eval_defaults` and
`train_defaults`; a flag overrides them) and at most `MAX_TURNS` turns (the default agent's; `rllm eval
--max-turns N` overrides it): turns stay short and episodes stop after a few (on a CPU the tasks' own time budgets
still bound a run; see `TURN_TOKENS` for what was measured).
An episode whose history outgrows the model's context ends `context_exceeded` (`rllm_envs.terminal.agent`), and
unless the verifier finds the task done, that is its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from rllm_envs.harbor.benchmark import HarborBenchmark
from rllm_envs.harbor.task import HarborTask, load_tasks
from rllm_rollout.rollout import Rollout

__all__ = ["MAX_TURNS", "TASKS_DIR", "TIERS", "TURN_TOKENS", "TerminalBenchmark", "is_heldout", "tier_of"]

TURN_TOKENS = 128
"""Completion tokens per turn for `rllm eval` / `rllm train terminal` unless told otherwise: room for a command
and a line about it (the agent asks for "the next command only"), where the 512 `rllm eval` gives other benchmarks
lets a small model ramble. Measured with the embedded SmolLM2-135M on 2 shared CPU cores, 16 episodes at once
(~11 completion tok/s in all): a turn took ~90 s even at 128 tokens, so most episodes still end at their time
budget (the task's agent timeout less 10 %: 270-810 s) after 2-4 turns, and the first 30 of the 34 episodes took
16.6 min. On a CPU the time budgets bound `rllm eval terminal` whatever the token budget; a small one buys the
most turns within them (34 at once was worse: ~7 tok/s in all, 1-2 turns an episode)."""
MAX_TURNS = 10
"""Turns (LLM calls) per episode of the default agent (the agent's own default is 30). One command can be a whole
script (every task's oracle is a single solution/solve.sh), so ten leave room to look, act and check; a model
served on a GPU takes seconds a turn, and an episode that loops on a CPU stops well before its time budget."""

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
    train_defaults: ClassVar[Mapping[str, Any]] = {"train_split": "train", "val_split": "heldout",
                                                   "max_tokens": TURN_TOKENS}
    eval_defaults: ClassVar[Mapping[str, Any]] = {"max_tokens": TURN_TOKENS}

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

    def default_rollout(self) -> Rollout:
        """The built-in terminal agent (rollout name `terminal`) with at most `MAX_TURNS` turns."""
        from rllm_envs.terminal.agent import make_terminal_agent

        return make_terminal_agent(max_turns=MAX_TURNS)
