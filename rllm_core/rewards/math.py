"""Math grading: extract the final answer, then check it against the gold answer with math-verify.

math-verify handles what string matching cannot: `\\frac{1}{2}` vs `0.5`, `3\\sqrt{2}` vs `\\sqrt{18}`,
intervals, sets, units in `\\text{}`. Both sides are wrapped in `$...$` when they are bare LaTeX so its LaTeX
extractor sees them; a plain-number fast path avoids sympy for the common GSM8K case.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from rllm_core.rewards._time_limit import call_with_time_limit
from rllm_core.rewards.extract import ExtractorName, extract_answer
from rllm_core.rewards.types import RewardResult

__all__ = ["grade_math", "math_equal"]

log = logging.getLogger("rllm.rewards.math")
# We enforce our own wall-clock limit (math-verify's SIGALRM one only works in the main thread), so its
# "timeout is disabled" warnings are noise to the user.
for _name in ("math_verify.utils", "math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)

_PLAIN_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
_UNIT_WORDS = re.compile(r"\s*(?:\\[,;!\s]|\\text\{[^}]*\}|\\mbox\{[^}]*\}|\^\\circ|°|%|\\%|\$)\s*")


def _as_number(text: str) -> float | None:
    s = text.strip().replace(",", "").rstrip(".")
    if _PLAIN_NUMBER.match(s):
        return float(s)
    return None


def _latexify(text: str) -> str:
    s = text.strip()
    if "$" in s or "\\boxed" in s:
        return s
    return f"${s}$"


def _verify(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    # Timeouts are ours (call_with_time_limit): math-verify's SIGALRM ones fail outside the main thread.
    gold_parsed = parse(_latexify(gold), parsing_timeout=None)  # type: ignore[arg-type]
    ans_parsed = parse(_latexify(answer), parsing_timeout=None)  # type: ignore[arg-type]
    if not gold_parsed or not ans_parsed:
        return False
    return bool(verify(gold_parsed, ans_parsed, timeout_seconds=None))


def math_equal(gold: str, answer: str, timeout_s: float = 5.0) -> bool:
    """True when `answer` is mathematically the same as `gold`; raises TimeoutError past `timeout_s`."""
    g, a = _as_number(str(gold)), _as_number(str(answer))
    if g is not None and a is not None:
        return abs(g - a) <= 1e-6 * max(1.0, abs(g))
    if str(gold).strip() == str(answer).strip():
        return True
    if call_with_time_limit(_verify, timeout_s, str(gold), str(answer)):
        return True
    stripped_g, stripped_a = _UNIT_WORDS.sub("", str(gold)), _UNIT_WORDS.sub("", str(answer))
    if (stripped_g, stripped_a) != (str(gold), str(answer)) and stripped_g and stripped_a:
        return call_with_time_limit(_verify, timeout_s, stripped_g, stripped_a)
    return False


def grade_math(response: str, gold: Any, extractor: ExtractorName = "boxed_or_last_number",
               timeout_s: float = 5.0) -> RewardResult:
    """Grade a free-text response against a gold answer (reasons: correct, wrong_answer,
    no_answer_extracted, timeout, error)."""
    extracted = extract_answer(response or "", extractor)
    if extracted is None:
        return RewardResult.fail("no_answer_extracted")
    try:
        ok = math_equal(str(gold), extracted, timeout_s=timeout_s)
    except TimeoutError:
        return RewardResult.fail("timeout", extracted, note=f"math-verify took over {timeout_s} s")
    except Exception as exc:  # a grader bug must not kill the run: record it
        log.debug("math grading failed", exc_info=True)
        return RewardResult.fail("error", extracted, note=f"{type(exc).__name__}: {exc}")
    return RewardResult.correct(extracted) if ok else RewardResult.fail("wrong_answer", extracted)
