"""Math word-problem and competition sets read from `<data_dir>/<name>/<split>.jsonl` (or the Hub).

Field names differ per set (they are kept byte for byte as published); each converter below maps one
layout to (instruction, gold, metadata). Gold answers are normalised only where the source format forces
it: GSM8K's `#### 18`, Minerva's `\\boxed{}` inside the solution, ASDiv's "9 (apples)", floats like 27.0.
"""

from __future__ import annotations

import re
from typing import Any

from rllm_envs.benchmarks.dataset import DatasetBenchmark, Example
from rllm_envs.rewards.extract import extract_boxed, extract_hash

__all__ = ["MATH_PROMPT", "first_field", "format_number", "math_benchmarks"]

MATH_PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def first_field(row: dict[str, Any], *names: str) -> Any:
    """The first of `names` present (and not None) in `row`; KeyError naming all of them otherwise."""
    for n in names:
        if row.get(n) is not None:
            return row[n]
    raise KeyError(f"none of the fields {list(names)}")


def format_number(value: Any) -> str:
    """27.0 → "27", 0.5 → "0.5", "1,000" → "1000"; other text unchanged."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    text = str(value).strip()
    if re.fullmatch(r"-?[\d,]+(?:\.\d+)?", text):
        num = float(text.replace(",", ""))
        return str(int(num)) if num.is_integer() else text.replace(",", "")
    return text


def _math(question: str, gold: Any, **meta: Any) -> Example:
    return MATH_PROMPT.format(question=str(question).strip()), gold, meta


def _gsm8k(row: dict[str, Any]) -> Example:
    gold = extract_hash(row["answer"])
    if gold is None:
        raise ValueError("the 'answer' field has no '#### <answer>' line")
    return _math(row["question"], format_number(gold))


def _problem_answer(row: dict[str, Any]) -> Example:
    meta = {k: row[k] for k in ("subject", "level", "unique_id") if k in row}
    return _math(first_field(row, "problem", "question"), format_number(first_field(row, "answer")), **meta)


def _minerva(row: dict[str, Any]) -> Example:
    gold = row.get("answer")
    if gold is None:
        gold = extract_boxed(first_field(row, "solution"))
    if gold is None:
        raise ValueError("no 'answer' field and no \\boxed{} answer in 'solution'")
    return _math(first_field(row, "problem", "question"), gold)


def _olympiad(row: dict[str, Any]) -> Example:
    final = first_field(row, "final_answer", "answer")
    if isinstance(final, list):
        final = ", ".join(str(f).strip("$ ") for f in final)
    return _math(first_field(row, "question", "problem"), str(final).strip("$ "), unit=row.get("unit"))


def _svamp(row: dict[str, Any]) -> Example:
    body = str(first_field(row, "Body", "body")).strip()
    question = str(first_field(row, "Question", "question")).strip()
    return _math(f"{body} {question}".strip(), format_number(first_field(row, "Answer", "answer")))


def _asdiv(row: dict[str, Any]) -> Example:
    body = str(first_field(row, "body", "Body")).strip()
    question = str(first_field(row, "question", "Question")).strip()
    answer = re.sub(r"\s*\(.*?\)\s*$", "", str(first_field(row, "answer", "Answer"))).strip()
    return _math(f"{body} {question}".strip(), format_number(answer))


def _mawps(row: dict[str, Any]) -> Example:
    return _math(first_field(row, "input", "question"), format_number(first_field(row, "target", "result", "answer")))


def math_benchmarks() -> list[DatasetBenchmark]:
    b = DatasetBenchmark
    return [
        b("gsm8k", category="math", grader="math", convert=_gsm8k, required=("question", "answer"),
          splits=("train", "test"), hub_id="openai/gsm8k", hub_config="main",
          rows_hint={"train": 7473, "test": 1319}, description="Grade-school math word problems (#### answers)"),
        b("math500", category="math", grader="math", convert=_problem_answer, required=("problem", "answer"),
          hub_id="HuggingFaceH4/MATH-500", rows_hint={"test": 500}, description="MATH-500 subset of Hendrycks MATH"),
        b("aime24", category="math", grader="math", convert=_problem_answer, required=("problem", "answer"),
          hub_id="HuggingFaceH4/aime_2024", hub_splits={"test": "train"}, rows_hint={"test": 30},
          description="AIME 2024"),
        b("amc23", category="math", grader="math", convert=_problem_answer,
          required=(("question", "problem"), "answer"), hub_id="math-ai/amc23", rows_hint={"test": 40},
          description="AMC 2023"),
        b("minerva_math", category="math", grader="math", convert=_minerva,
          required=(("problem", "question"), ("solution", "answer")), hub_id="math-ai/minervamath",
          rows_hint={"test": 272}, description="Minerva quantitative reasoning"),
        b("olympiadbench", category="math", grader="math", convert=_olympiad,
          required=(("question", "problem"), ("final_answer", "answer")), hub_id="Hothan/OlympiadBench",
          hub_config="OE_TO_maths_en_COMP", hub_splits={"test": "train"}, rows_hint={"test": 675},
          description="OlympiadBench, English text-only math"),
        b("svamp", category="math", grader="math", convert=_svamp,
          required=(("Body", "body"), ("Question", "question"), ("Answer", "answer")), hub_id="ChilleD/SVAMP",
          rows_hint={"test": 1000}, description="SVAMP word problems"),
        b("asdiv", category="math", grader="math", convert=_asdiv,
          required=(("body", "Body"), ("question", "Question"), ("answer", "Answer")), hub_id="EleutherAI/asdiv",
          hub_splits={"test": "validation"}, rows_hint={"test": 2215}, description="ASDiv word problems"),
        b("mawps", category="math", grader="math", convert=_mawps,
          required=(("input", "question"), ("target", "result", "answer")), hub_id="MU-NLPC/Calc-mawps",
          rows_hint={"test": 2065}, description="MAWPS word problems"),
    ]
