"""reasoning-gym's own scorers: regenerate the entry from (dataset, seed, size, index) and score the answer.

Entries are regenerated rather than stored so a Task stays plain JSON (some entries hold objects that do not
serialise). The reward is binary (score == 1.0); reasoning-gym's partial credit is kept as `raw_score`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_envs.rewards.extract import extract_tag

__all__ = ["grade_reasoning_gym", "reasoning_gym_dataset"]


@functools.lru_cache(maxsize=256)
def reasoning_gym_dataset(name: str, seed: int, size: int) -> Any:
    """The (cached) reasoning-gym dataset object; generation is deterministic in (name, seed, size)."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise BenchmarkError("reasoning-gym tasks need the reasoning-gym package: pip install 'rllm[bench]'") from exc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return reasoning_gym.create_dataset(name, seed=seed, size=size)


def grade_reasoning_gym(response: str, dataset: str, seed: int, size: int, index: int) -> RewardResult:
    """The answer is the last <answer>...</answer>, else the whole reply. Reasons: correct, wrong_answer,
    no_answer_extracted, format_error (no <answer> tag and the whole reply is not right either, or the
    scorer could not read the answer): "never uses the tags" and "wrong" need different fixes."""
    tagged = extract_tag(response or "")
    extracted = tagged or (response or "").strip() or None
    if extracted is None:
        return RewardResult.fail("no_answer_extracted")
    ds = reasoning_gym_dataset(dataset, seed, size)
    try:
        raw = float(ds.score_answer(extracted, ds[index]))
    except Exception as exc:  # some scorers raise on unparseable answers: that is a format problem
        return RewardResult.fail("format_error", extracted, note=f"{type(exc).__name__}: {exc}")
    if raw >= 1.0:
        return RewardResult.correct(extracted, raw_score=raw)
    if tagged is None:
        return RewardResult.fail("format_error", extracted, raw_score=raw, note="no <answer></answer> tag")
    return RewardResult.fail("wrong_answer", extracted, raw_score=raw)
