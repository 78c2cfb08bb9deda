"""Rewards: graders that turn a response into a `RewardResult` (value + reason + correctness).

    grade_math(response, gold, extractor)      math-verify after answer extraction, with a time limit
    grade_choice(response, gold_letter)        multiple choice by letter
    grade_code(response, tests, entry_point)   tests run in the sandbox (`run_python`); grade_stdio for stdin/stdout
    grade_reasoning_gym(response, ...)         reasoning-gym's own scorer
    extract_answer(text, how)                  boxed / #### / last number / choice / <answer> tag
Reasons: correct, wrong_answer, no_answer_extracted, format_error, truncated, timeout, error.
"""

from rllm_core.rewards import REASONS, RewardReason, RewardResult
from rllm_envs.rewards.choice import grade_choice
from rllm_envs.rewards.code import grade_code, grade_stdio, humaneval_program, stdio_program
from rllm_envs.rewards.extract import (
    ExtractorName,
    extract_answer,
    extract_boxed,
    extract_choice,
    extract_code,
    extract_hash,
    extract_last_number,
    extract_tag,
)
from rllm_envs.rewards.math import grade_math, math_equal
from rllm_envs.rewards.reasoning_gym import grade_reasoning_gym
from rllm_envs.rewards.sandbox import SandboxLimits, SandboxResult, network_isolation_available, run_python

__all__ = [
    "REASONS",
    "ExtractorName",
    "RewardReason",
    "RewardResult",
    "SandboxLimits",
    "SandboxResult",
    "extract_answer",
    "extract_boxed",
    "extract_choice",
    "extract_code",
    "extract_hash",
    "extract_last_number",
    "extract_tag",
    "grade_choice",
    "grade_code",
    "grade_math",
    "grade_reasoning_gym",
    "grade_stdio",
    "humaneval_program",
    "math_equal",
    "network_isolation_available",
    "run_python",
    "stdio_program",
]
