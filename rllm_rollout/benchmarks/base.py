"""What a benchmark is: a named source of Tasks plus the grader for them and a rollout to attempt them.

Subclasses implement `load` (rows → Tasks) and `grade` (a final response → RewardResult). `score` wraps
`grade` with what is the same for every benchmark: an episode that errored or timed out is scored with that
reason, a wrong answer whose last LLM call hit its token limit is reported as `truncated`, and a wrong answer of
an episode that ran out of context (`termination_reason` context_exceeded, see `rllm_rollout.engine`) as
`context_exceeded`, so a summary tells "the model was cut off" from "the model was wrong".

`train_defaults` / `eval_defaults` are the benchmark's recommended `rllm train` / `rllm eval` options (a multi-turn
benchmark wants a small per-turn token budget); they fill only the options the user left unset.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_core.types import Episode, Task
from rllm_rollout.capture.assemble import upstream_status
from rllm_rollout.rollout import Rollout

__all__ = ["Benchmark", "context_exceeded_result", "last_finish_reason", "recommended_unset", "response_text"]


def response_text(episode: Episode) -> str:
    """The episode's final answer: `artifacts["answer"]` when the rollout set it, else the last call's text."""
    answer = episode.artifacts.get("answer")
    if isinstance(answer, str):
        return answer
    steps = episode.steps
    return (steps[-1].text or "") if steps else ""


def last_finish_reason(episode: Episode) -> str | None:
    steps = episode.steps
    return steps[-1].finish_reason if steps else None


def recommended_unset(recommended: Mapping[str, Any], fields: Any, given: Any, benchmark: str, what: str
                      ) -> dict[str, Any]:
    """The benchmark's recommended options (`train_defaults` / `eval_defaults`) that name a field of `fields` and
    that the user did not set (`given`, a model's `model_fields_set`); unknown names are warned about once here."""
    unknown = sorted(set(recommended) - set(fields))
    if unknown:
        logging.getLogger("rllm.benchmarks").warning("benchmark %r recommends unknown %s options %s; ignored",
                                                     benchmark, what, unknown)
    return {k: v for k, v in recommended.items() if k in fields and k not in given}


_ANSWER_REASONS = ("wrong_answer", "no_answer_extracted", "format_error", "truncated")
"""Reasons about the answer itself, which a full context explains; errors, timeouts and sandbox failures stay."""


def context_exceeded_result(episode: Episode, result: RewardResult) -> RewardResult:
    """`result` with reason `context_exceeded` when the episode ran out of context (the agent ended it, or the
    server refused its prompt: `artifacts["context_exceeded_at_turn"]`) and the answer was not right (a reason of
    `_ANSWER_REASONS`); the reward the grader gave is kept (a verifier's partial credit for what was done is
    real). Otherwise `result` as is."""
    if result.is_correct or result.reason not in _ANSWER_REASONS or "context_exceeded_at_turn" not in episode.artifacts:
        return result
    return result.model_copy(update={"reason": "context_exceeded"})


class Benchmark(ABC):
    """A benchmark: `name`, `category`, `reward` (grader kind), `offline`, `load`, `score`, `default_rollout`."""

    name: str
    category: str
    reward: str
    description: str = ""
    splits: tuple[str, ...] = ("test",)
    source: str = ""
    """Where the rows come from (a file layout, a Hub dataset id, a package)."""
    train_defaults: ClassVar[Mapping[str, Any]] = {}
    """Recommended `rllm train` options for this task (e.g. a short max_tokens for one-number answers); they
    fill only the options the user left unset."""
    score_names: ClassVar[tuple[str, ...]] = ()
    """Scores the grader reports beside the reward (`details["scores"]`), which `--reward` can mix by name."""
    reward_presets: ClassVar[Mapping[str, str]] = {}
    """Named `--reward` specs for this benchmark (e.g. FinQA's accuracy_and_reasoning = rule:0.5,judge:0.5)."""
    eval_defaults: ClassVar[Mapping[str, Any]] = {}
    """Recommended `rllm eval` options (`rllm_envs.eval.EvalOptions` names, e.g. max_tokens per LLM call,
    concurrency); they fill only the options the user left unset (a flag always wins). Keep them consistent with
    `train_defaults`: an agent should be evaluated the way it is trained."""

    @property
    def offline(self) -> bool:
        """True when this benchmark can load here without the Hugging Face Hub."""
        return True

    def rows(self, split: str = "test") -> int | None:
        """How many rows `split` has, when known without loading it."""
        return None

    @abstractmethod
    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        """The tasks of `split` (the first `max_examples` of them); procedural sets are generated from `seed`."""

    @abstractmethod
    def grade(self, task: Task, response: str) -> RewardResult:
        """Grade one final response text for `task`."""

    def reference_response(self, task: Task) -> str:
        """A response that `grade` scores as correct (the gold answer, formatted as a model would give it)."""
        return f"The answer is \\boxed{{{task.ground_truth}}}."

    def score(self, task: Task, episode: Episode) -> RewardResult:
        """Score a finished episode; never raises (a grader failure is scored as reason `error`)."""
        if episode.termination_reason == "timeout":
            return RewardResult.fail("timeout", note=episode.error or "")
        if episode.error is not None or episode.termination_reason in ("error", "cancelled"):
            refused = next((s.error for s in episode.steps if upstream_status(s.error) == 400), None)
            if refused is not None:  # the server refused what it was sent: the input, not the agent, is at fault
                return RewardResult.fail("bad_input", note=refused[-500:])
            return RewardResult.fail("error", note=(episode.error or "")[-500:])
        result = self.score_response(task, response_text(episode), last_finish_reason(episode))
        return context_exceeded_result(episode, result)

    def score_response(self, task: Task, response: str, finish_reason: str | None = None) -> RewardResult:
        """`grade`, plus what holds for every grader: a wrong answer cut off by the token limit
        (`finish_reason == "length"`) is `truncated`, and a grader that raises gives `error`. Used for
        episodes and for each role's own answer, so both get the same reasons."""
        try:
            result = self.grade(task, response)
        except Exception as exc:
            return RewardResult.fail("error", note=f"grader failed: {type(exc).__name__}: {exc}")
        if not result.is_correct and finish_reason == "length":
            return result.model_copy(update={"reason": "truncated", "reward": 0.0})
        return result

    def default_rollout(self) -> Rollout:
        """One chat call with the task's instruction; the reply is the answer."""
        from rllm_rollout.benchmarks.rollouts import single_turn

        return single_turn

    def named_agent(self, name: str) -> Rollout | None:
        """A built-in agent of this benchmark called `name` (`--agent oracle`, `--agent nop`), or None."""
        return None

    def wrap_rollout(self, rollout: Rollout, *, sandbox: str | None = None) -> Rollout:
        """The rollout each episode runs. A sandboxed benchmark returns one that starts the task's sandbox (provider
        `sandbox`, None: its default), runs `rollout` inside it (`rllm_core.sandbox.current_sandbox()`), verifies and
        closes it; others return `rollout` unchanged (and refuse a `sandbox` they cannot use)."""
        if sandbox is not None:
            raise BenchmarkError(f"benchmark {self.name!r} runs no sandbox; drop --sandbox {sandbox}")
        return rollout

    def info(self) -> dict[str, Any]:
        """The row `rllm bench list --json` prints (rows of the test split, or of the only split there is)."""
        split = "test" if "test" in self.splits else self.splits[0]
        return {"name": self.name, "category": self.category, "rows": self.rows(split), "reward": self.reward,
                "offline": self.offline, "splits": list(self.splits), "source": self.source}

    # ---------------------------------------------------------------- helpers for subclasses
    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise BenchmarkError(f"benchmark {self.name!r} has no split {split!r}; its splits are {list(self.splits)}")

    def _task(self, index: int, split: str, instruction: str | list[dict[str, Any]], ground_truth: Any,
              **metadata: Any) -> Task:
        return Task(id=f"{self.name}:{split}:{index}", instruction=instruction, ground_truth=ground_truth,
                    benchmark=self.name, split=split, metadata=metadata)

    def __repr__(self) -> str:
        return f"<Benchmark {self.name} ({self.category}, {self.reward})>"
