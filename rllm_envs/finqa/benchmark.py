"""The `finqa` benchmark: questions over a company's financial tables, answered with SQL and a calculator.

The agent (`finqa_agent`) ends with `FINAL ANSWER: ...`; the grade is exact match with numeric tolerance, where
rLLM grades with an LLM judge (gpt-5-nano). A judge needs a key and a network and is not reproducible, so here
the first number of the final answer is compared with the gold's at relative tolerance 1e-2 (1 %), reading what
filings print: thousands separators, `$`, negatives in parentheses, a unicode minus, percentages (12.5 % equals
0.125), and scale words (1.2 billion equals 1,200 million; a bare number is also compared as written, since the
tables are usually "in millions"). A gold without a number (e.g. "Yes") is compared as normalised text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.finqa.data import FOLDER, HUB_FILE, HUB_ID, SPLITS, read_split
from rllm_rollout.benchmarks.base import Benchmark
from rllm_rollout.benchmarks.data import count_rows, resolve_data_dir, split_file
from rllm_rollout.rollout import Rollout

__all__ = ["REL_TOL", "FinQA", "Number", "extract_final_answer", "grade_answer", "parse_numbers"]

REL_TOL = 1e-2
_SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "mn": 1e6, "mm": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9,
           "b": 1e9, "trillion": 1e12}
_MARKER = r"FINAL\s+ANSWER\**\s*:\s*\**"
_CODE_BLOCK = re.compile(rf"```[a-z]*\s*{_MARKER}(.*?)```", re.I | re.S)
_PARAGRAPH = re.compile(rf"{_MARKER}(.*?)(?=\n\s*\n|$)", re.I | re.S)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUM = re.compile(
    r"(?P<open>\()?\s*(?P<sign>[-+\u2212])?\s*\$?\s*"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"\s*(?P<unit>%|percent\b|per\s+cent\b|thousand\b|million\b|billion\b|trillion\b|bn\b|mn\b|mm\b|[kmb]\b)?"
    r"\s*(?P<close>\))?", re.I)
_DECREASE = re.compile(r"\b(decrease[ds]?|declin\w*|drop\w*|fell|fall\w*|lower|reduc\w*|loss)\b", re.I)
SYSTEM_HINT = "Use the tools to read the tables, then end your reply with 'FINAL ANSWER: <answer>'."


@dataclass(frozen=True)
class Number:
    """A number as printed: its value, whether it was a percent, its scale word's factor (None: no word)."""

    value: float
    percent: bool = False
    scale: float | None = None
    yearlike: bool = False


def extract_final_answer(response: str) -> str | None:
    """The text after the last `FINAL ANSWER:` (to the end of its paragraph; a fenced block wins), else the last
    `\\boxed{}`; None when the response has neither."""
    text = response or ""
    if blocks := _CODE_BLOCK.findall(text):
        return blocks[-1].strip()
    if found := _PARAGRAPH.findall(text):
        return found[-1].strip()
    if boxed := _BOXED.findall(text):
        return boxed[-1].strip()
    return None


def parse_numbers(text: str) -> list[Number]:
    out = []
    for m in _NUM.finditer(text or ""):
        raw = m.group("num")
        value = float(raw.replace(",", ""))
        negative = m.group("sign") in ("-", "\u2212") or bool(m.group("open") and m.group("close"))
        unit = (m.group("unit") or "").lower()
        percent = unit in ("%", "percent") or unit.startswith("per ")
        scale = _SCALES.get(unit)
        yearlike = (not negative and not unit and raw.isdigit() and len(raw) == 4 and 1900 <= value <= 2100)
        out.append(Number(-value if negative else value, percent, scale, yearlike))
    return out


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) or abs(a - b) <= 1e-9


def _matches(answer: Number, gold: Number) -> bool:
    pairs = [(answer.value, gold.value)]
    if answer.scale and gold.scale:
        pairs.append((answer.value * answer.scale, gold.value * gold.scale))
    if gold.percent and not answer.percent:
        pairs.append((answer.value * 100, gold.value))
    if answer.percent and not gold.percent:
        pairs.append((answer.value / 100, gold.value))
    return any(_close(a, g) for a, g in pairs)


def _norm_text(text: str) -> str:
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).strip()


def grade_answer(response: str, gold: Any) -> RewardResult:
    """Grade one response against the gold answer; see the module docstring for the rules."""
    if not (response or "").strip():
        return RewardResult.fail("no_answer_extracted", note="empty response")
    final = extract_final_answer(response)
    if final is None:
        return RewardResult.fail("format_error", note="no 'FINAL ANSWER:' in the response")
    gold_text = str(gold if gold is not None else "").strip()
    gold_numbers = parse_numbers(gold_text)
    if not gold_numbers:  # a textual answer
        want, got = _norm_text(gold_text), _norm_text(final)
        if not got:
            return RewardResult.fail("no_answer_extracted", final)
        ok = bool(want) and (got == want or got.startswith(want + " "))
        return RewardResult.correct(final) if ok else RewardResult.fail("wrong_answer", final)
    target = next((n for n in gold_numbers if not n.yearlike), gold_numbers[0])
    numbers = parse_numbers(final)
    if not numbers:
        return RewardResult.fail("no_answer_extracted", final, note="no number in the final answer")
    answer = next((n for n in numbers if not n.yearlike), numbers[0]) if not target.yearlike else numbers[0]
    if _matches(answer, target):
        return RewardResult.correct(final, value=answer.value)
    if target.value < 0 < answer.value and _DECREASE.search(final) and _matches(Number(-answer.value,
                                                                                  answer.percent, answer.scale),
                                                                           target):
        return RewardResult.correct(final, value=-answer.value)
    return RewardResult.fail("wrong_answer", final, value=answer.value, gold=target.value)


class FinQA(Benchmark):
    """FinQA as rLLM runs it: a tool-calling agent over SQLite tables (rows carry their tables)."""

    name = "finqa"
    category = "tool_use"
    reward = "numeric_match"
    splits = SPLITS
    description = "FinQA (rLLM): 10-K table questions answered with SQL + calculator tools, multi-turn"
    source = f"<data_dir>/{FOLDER}/<split>.jsonl | hf:{HUB_ID} ({HUB_FILE})"
    reward_presets = {"accuracy_and_reasoning": "rule:0.5,judge:0.5"}
    """The seed's reward: the answer's accuracy (this grader) and the reasoning's quality (an LLM judge, rubric
    answer_and_reasoning) together: `--reward accuracy_and_reasoning --judge MODEL@URL`."""

    def _local(self, split: str) -> Any:
        try:
            return split_file(resolve_data_dir(None), FOLDER, split)
        except BenchmarkError:
            return None

    @property
    def offline(self) -> bool:
        return any(self._local(s) is not None for s in self.splits)

    def rows(self, split: str = "test") -> int | None:
        path = self._local(split)
        return count_rows(path) if path is not None else None

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        rows, _ = read_split(split, data_dir, max_examples)
        tasks = []
        shared: dict[tuple[str, ...], list[dict[str, Any]]] = {}  # one copy per company's tables, not per question
        for i, row in enumerate(rows):
            key = (row.company, *(t.name for t in row.tables))
            tables = [t.model_dump() for t in row.tables]
            if shared.get(key) == tables:
                tables = shared[key]
            else:
                shared[key] = tables
            company = f"Company: {row.company}\n\n" if row.company else ""
            instruction = f"{company}{row.question}\n\n{SYSTEM_HINT}"
            tasks.append(self._task(i, split, instruction, row.answer, question=row.question, row_id=row.id,
                                    company=row.company, question_type=row.question_type,
                                    expected_tables=row.expected_tables,
                                    tables=tables))
        return tasks

    def grade(self, task: Task, response: str) -> RewardResult:
        return grade_answer(response, task.ground_truth)

    def reference_response(self, task: Task) -> str:
        return f"FINAL ANSWER: {task.ground_truth}"

    def default_rollout(self) -> Rollout:
        from rllm_envs.finqa.agent import finqa_agent

        return finqa_agent
