"""A benchmark's reward mixed from parts by weights: `--reward em:0.7,judge:0.3`.

A part is `rule` (the benchmark's own reward), a score its grader names (`details.scores`: hotpotqa's `em`,
`f1`, `supporting_recall`), or `judge` (an LLM judge's 0-1 score against a rubric, `rllm_envs.rewards.judge`). A
preset name stands for a whole spec (`Benchmark.reward_presets`: FinQA's `accuracy_and_reasoning`, the seed's
"the answer's accuracy and the reasoning's quality together"). The mixed benchmark (`MixedRewardBenchmark`) is the
benchmark with `score` replaced; `is_correct` stays the rule's. An episode the rule could not score (an error,
a timeout) is not judged; a judge that fails gives reason `judge_error` (the trainer leaves those episodes out).
"""

from __future__ import annotations

from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.rewards import RewardResult
from rllm_core.types import Episode, Task
from rllm_envs.rewards.judge import Judge, JudgeError, JudgeModel, load_rubric
from rllm_rollout.benchmarks.base import Benchmark, response_text

__all__ = ["MixedRewardBenchmark", "parse_reward_spec", "with_reward"]

_UNSCORED = ("error", "timeout", "sandbox_error", "verifier_error", "harness_error", "judge_error")


def parse_reward_spec(spec: str, presets: dict[str, str] | None = None) -> dict[str, float]:
    """`name:weight,...` (or a preset's name) as {part: weight}; weights are non-negative and not all 0."""
    text = (presets or {}).get(spec.strip(), spec)
    parts: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, weight = item.partition(":")
        try:
            value = float(weight) if sep else 1.0
        except ValueError:
            raise ConfigError(f"--reward {spec!r}: {weight!r} in {item!r} is not a number (use name:weight, "
                              "e.g. em:0.7,judge:0.3)") from None
        if value < 0 or not name.strip():
            raise ConfigError(f"--reward {spec!r}: {item!r} needs a name and a weight of 0 or more")
        parts[name.strip()] = value
    if not parts or sum(parts.values()) <= 0:
        raise ConfigError(f"--reward {spec!r} names no part with a positive weight")
    return parts


class MixedRewardBenchmark(Benchmark):
    """`inner` with its reward replaced by the weighted mix (every other attribute is the inner benchmark's)."""

    def __init__(self, inner: Benchmark, parts: dict[str, float], judge: Judge | None) -> None:
        self.inner, self.parts, self.judge = inner, parts, judge
        for attr in ("name", "category", "description", "splits", "source", "train_defaults", "eval_defaults",
                     "score_names", "reward_presets"):
            setattr(self, attr, getattr(inner, attr))
        self.reward = f"{inner.reward}+mix({','.join(f'{k}:{v:g}' for k, v in parts.items())})"

    def __getattr__(self, name: str) -> Any:  # what a subclass adds (hotpotqa's corpus_file, ...)
        return getattr(self.inner, name)

    @property
    def offline(self) -> bool:
        return self.inner.offline

    def rows(self, split: str = "test") -> int | None:
        return self.inner.rows(split)

    def load(self, *args: Any, **kwargs: Any) -> list[Task]:
        return self.inner.load(*args, **kwargs)

    def grade(self, task: Task, response: str) -> RewardResult:
        return self.inner.grade(task, response)

    def default_rollout(self) -> Any:
        return self.inner.default_rollout()

    def named_agent(self, name: str) -> Any:
        return self.inner.named_agent(name)

    def wrap_rollout(self, rollout: Any, *, sandbox: str | None = None) -> Any:
        return self.inner.wrap_rollout(rollout, sandbox=sandbox)

    def reference_response(self, task: Task) -> str:
        return self.inner.reference_response(task)

    def score(self, task: Task, episode: Episode) -> RewardResult:
        base = self.inner.score(task, episode)
        if base.reason in _UNSCORED:
            return base
        scores = dict(base.details.get("scores") or {})
        values: dict[str, float] = {}
        details: dict[str, Any] = dict(base.details)
        for part in self.parts:
            if part == "rule":
                values[part] = base.reward
            elif part == "judge":
                assert self.judge is not None
                question = str(task.metadata.get("question") or task.instruction)
                gold = task.ground_truth
                reference = ", ".join(map(str, gold)) if isinstance(gold, list) else ("" if gold is None else str(gold))
                try:
                    record = self.judge.judge(question, response_text(episode), reference)
                except JudgeError as exc:
                    return base.model_copy(update={"reward": 0.0, "reason": "judge_error",
                                                   "details": {**details, "judge_error": str(exc)}})
                details["judge"] = record.model_dump()
                values[part] = record.score
            elif part in scores:
                values[part] = float(scores[part])
            else:  # an episode whose grader did not report this score (e.g. no answer): it counts 0
                values[part] = 0.0
        total = sum(self.parts.values())
        reward = sum(w * values[p] for p, w in self.parts.items()) / total
        details["scores"] = {**scores, **{f"reward/{p}": v for p, v in values.items()}}
        return base.model_copy(update={"reward": reward, "details": details})


def with_reward(bench: Benchmark, reward: str | None, judge: str | None = None, rubric: str | None = None
                ) -> Benchmark:
    """`bench` with its reward mixed by `reward` (None: unchanged); `judge` and `rubric` for a `judge` part."""
    if not reward:
        if judge or rubric:
            raise ConfigError("--judge and --rubric need a --reward that has a judge part, e.g. rule:0.5,judge:0.5")
        return bench
    parts = parse_reward_spec(reward, getattr(bench, "reward_presets", None))
    known = {"rule", "judge", *getattr(bench, "score_names", ())}
    if unknown := sorted(set(parts) - known):
        raise ConfigError(f"--reward: {', '.join(unknown)} is not a part of {bench.name!r}'s reward; its parts: "
                          f"{', '.join(sorted(known))}")
    the_judge = Judge(JudgeModel.from_spec(judge), load_rubric(rubric)) if "judge" in parts else None
    return MixedRewardBenchmark(bench, parts, the_judge)
