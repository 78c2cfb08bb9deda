"""Multiple choice graded by letter: the extracted letter must equal the gold letter."""

from __future__ import annotations

from rllm_core.rewards.extract import extract_choice
from rllm_core.rewards.types import RewardResult

__all__ = ["grade_choice"]


def grade_choice(response: str, gold_letter: str, letters: str = "ABCDEFGHIJ") -> RewardResult:
    """Reasons: correct, wrong_answer, no_answer_extracted."""
    gold = str(gold_letter).strip().strip("()").upper()
    if len(gold) != 1 or gold not in letters:
        raise ValueError(f"gold answer {gold_letter!r} is not one letter of {letters!r}")
    got = extract_choice(response or "", letters)
    if got is None:
        return RewardResult.fail("no_answer_extracted")
    return RewardResult.correct(got) if got == gold else RewardResult.fail("wrong_answer", got)
