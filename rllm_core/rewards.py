"""The outcome of grading one answer: a reward, the reason for it, and whether it counts as correct.

Every grader in rllm returns a `RewardResult`, so an eval summary can break results down by reason and a
trainer can tell "the model answered wrong" from "the output was cut off" or "the sandbox timed out".
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["REASONS", "RewardReason", "RewardResult"]

RewardReason = Literal[
    "correct", "wrong_answer", "no_answer_extracted", "format_error", "truncated", "timeout", "error",
    "verifier_error", "sandbox_error", "context_exceeded", "resource_limit", "harness_error", "judge_error",
    "bad_input",
]
REASONS: tuple[str, ...] = (
    "correct", "wrong_answer", "no_answer_extracted", "format_error", "truncated", "timeout", "error",
    "verifier_error", "sandbox_error", "context_exceeded", "resource_limit", "harness_error", "judge_error",
    "bad_input",
)
"""`verifier_error` / `sandbox_error`: a sandboxed task's verifier wrote no usable reward / its sandbox failed;
`context_exceeded`: a multi-turn episode outgrew the model's context before it answered right;
`resource_limit`: graded code ran into its memory, process or disk limit (counted over its whole process tree);
`harness_error`: a CLI agent run as the episode's agent (rllm_core.harness) failed to start or exited at once;
`judge_error`: an LLM judge of the reward timed out, failed or gave no verdict that could be read (the episode is
not trained on: its reward is unknown, not 0);
`bad_input`: the model server refused the episode's input with HTTP 400 (an image sent to a text-only model, a
corrupt, oversized or unreachable image): the run goes on, the episode has no sample to train."""


class RewardResult(BaseModel):
    """A graded answer. `reason` is one of REASONS; `details` keeps grader-specific extras (raw scores...)."""

    model_config = ConfigDict(extra="forbid")

    reward: float
    reason: RewardReason
    is_correct: bool
    extracted: str | None = None
    """The answer the grader extracted from the response, when it extracted one."""
    details: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def correct(cls, extracted: str | None = None, **details: Any) -> RewardResult:
        return cls(reward=1.0, reason="correct", is_correct=True, extracted=extracted, details=details)

    @classmethod
    def fail(cls, reason: RewardReason, extracted: str | None = None, **details: Any) -> RewardResult:
        return cls(reward=0.0, reason=reason, is_correct=False, extracted=extracted, details=details)
