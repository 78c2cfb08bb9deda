"""The grading corpus: hand-written replies in the formats models produce, each with the verdict a careful
human grader gives, and the graders must agree on every one of them.

`tests/data/grading_corpus.jsonl` has three families. math: (response, gold, expect) through `grade_math`;
choice: (response, gold letter, the question's letters, expect) through `grade_choice`; code: (response, the
lines the right block has, lines of wrong blocks) through `extract_code`, read the way the code graders read
it (the extracted code, else the whole reply). Cases tagged `shortcut` are what a reward-hacking policy would
try (hedges, lists of numbers, several boxes, an unclosed box): each of them must get no reward.
`benchmarks/grader_comparison.py` runs the math family through math-verify and mathruler as well.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rllm_envs.rewards import extract_code, grade_choice, grade_math, math_equal
from rllm_envs.rewards.choice import choice_letters
from rllm_envs.rewards.extract import extract_answers
from rllm_envs.rewards.reply import settle, strip_thinking

CORPUS = Path(__file__).parent / "data" / "grading_corpus.jsonl"
CASES: list[dict[str, Any]] = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line]


def _of(family: str) -> list[dict[str, Any]]:
    return [c for c in CASES if c["family"] == family]


def code_verdict(case: dict[str, Any]) -> bool:
    """Whether extraction picked the right block: the code a grader would run holds every `want` line and
    no `avoid` line; `want == []` means the reply holds no code to run at all."""
    code = extract_code(case["response"])
    run = code if code is not None else case["response"]
    if not case["want"]:
        return not run.strip()
    return all(w in run for w in case["want"]) and not any(a in run for a in case["avoid"])


def test_corpus_size_and_coverage() -> None:
    counts = Counter(c["family"] for c in CASES)
    assert counts["math"] >= 170 and counts["choice"] >= 90 and counts["code"] >= 40 and len(CASES) >= 300
    assert len({c["id"] for c in CASES}) == len(CASES)
    math_tags = Counter(t for c in _of("math") for t in c["tags"])
    for fmt in ("latex", "units", "currency", "percent", "thousands", "fraction", "boxed", "unboxed", "multiple",
                "think", "shortcut"):
        assert math_tags[fmt] >= 5, f"math corpus has only {math_tags[fmt]} {fmt!r} cases"
    for family in ("math", "choice"):  # both verdicts, or the corpus could not catch a grader that says yes
        assert Counter(c["expect"] for c in _of(family)).keys() == {True, False}


@pytest.mark.parametrize("case", _of("math"), ids=lambda c: c["id"])
def test_math_corpus(case: dict[str, Any]) -> None:
    got = grade_math(case["response"], case["gold"], case.get("extractor", "boxed_or_last_number"))
    assert got.is_correct is case["expect"], f"{case['tags']}: extracted {got.extracted!r}, {got.reason}"


@pytest.mark.parametrize("case", _of("choice"), ids=lambda c: c["id"])
def test_choice_corpus(case: dict[str, Any]) -> None:
    got = grade_choice(case["response"], case["gold"], case["letters"])
    assert got.is_correct is case["expect"], f"{case['tags']}: extracted {got.extracted!r}, {got.reason}"


@pytest.mark.parametrize("case", _of("code"), ids=lambda c: c["id"])
def test_code_corpus(case: dict[str, Any]) -> None:
    assert code_verdict(case), f"{case['tags']}: extracted {extract_code(case['response'])!r}"


def test_issue_examples() -> None:
    """The reported failures, one by one."""
    for boxed in ("\\$18", "\\$18.00"):
        assert grade_math(f"So \\boxed{{{boxed}}}.", "18").is_correct
    assert grade_math("\\boxed{\\$1,080}", "1080").is_correct
    cut = grade_math("The answer is \\boxed{\\frac{1}{2", "2")
    assert cut.reason == "no_answer_extracted"  # not the last number of a reply cut off inside its box
    assert not grade_math("\\boxed{1,2}", "12").is_correct and not math_equal("12", "1,2")
    ten = "ABCDEFGHIJ"
    assert grade_choice("I think it's (C)", "C", ten).is_correct
    assert grade_choice("A. wrong\nB. wrong\nC. right\nD. wrong. So C", "C").is_correct
    for reply in ("\\boxed{\\text{B}}", "The answer is option B", "The correct option is B."):
        assert grade_choice(reply, "B").is_correct, reply


def test_hedges_are_wrong_whichever_is_gold() -> None:
    for gold in ("5", "6"):
        for reply in ("\\boxed{5 \\text{ or } 6}", "\\boxed{5} or \\boxed{6}", "The answer is 5 or 6.", "5 6"):
            got = grade_math(reply, gold)
            assert not got.is_correct, (reply, gold)
    hedged = grade_choice("The answer is A or B.", "A")
    assert hedged.reason == "wrong_answer" and hedged.details["hedged"] == ["A", "B"]
    assert choice_letters("A\nB\nC\nD", "ABCD") == ["A", "B", "C", "D"]


def test_revision_replaces_conflict_joins() -> None:
    """Two different answers are a hedge unless the reply takes the first back."""
    text = "x \\boxed{3} y \\boxed{4}"
    hits = [(2, 12, ["3"]), (15, 25, ["4"])]
    assert settle(hits, text) == ["3", "4"]
    revised = "x \\boxed{3} wait \\boxed{4}"
    assert settle([(2, 12, ["3"]), (18, 28, ["4"])], revised) == ["4"]
    assert settle([(0, 1, ["4"]), (2, 3, ["4"])], "....") == ["4"]
    assert grade_math("So \\boxed{7}. Wait, I made a mistake: \\boxed{9}.", "9").is_correct


def test_thinking_is_not_read() -> None:
    assert strip_thinking("<think>\\boxed{4}</think> \\boxed{5}") == " \\boxed{5}"
    assert strip_thinking("<think>still going") is None
    assert strip_thinking("opened by the template</think>\n5") == "\n5"
    assert extract_answers("<think>\\boxed{4}</think>", "boxed") is None
    assert extract_code("<think>```python\nx = 1\n```") == ""  # no code: not the reasoning run as a program


def test_many_answers_stay_cheap() -> None:
    """A reply of thousands of boxes or numbers is graded quickly (no math-verify call per answer)."""
    started = time.monotonic()
    assert not grade_math("".join(f"\\boxed{{{i}}}" for i in range(3000)), "3").is_correct
    assert grade_math("\\boxed{3}" * 3000, "3").is_correct
    assert not grade_math("$5 and $" * 3000, "6").is_correct
    assert time.monotonic() - started < 10
