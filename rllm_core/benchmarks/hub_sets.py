"""Hub-only benchmarks: loaded with `datasets` from their Hugging Face id, or from local JSONL in the same
layout (`<data_dir>/<name>/<split>.jsonl`) when the Hub is out of reach.

Multiple-choice sets are shown with lettered options and graded by letter; code sets run their tests in
the sandbox. Option order is fixed per row (GPQA's shuffle is seeded by the question) so reruns compare.
"""

from __future__ import annotations

import json
import random
from typing import Any

from rllm_core.benchmarks.dataset import DatasetBenchmark, Example
from rllm_core.benchmarks.math_sets import MATH_PROMPT, first_field, format_number
from rllm_core.rewards.extract import extract_boxed

__all__ = ["choice_prompt", "hub_benchmarks"]

LETTERS = "ABCDEFGHIJ"
CODE_PROMPT = "{question}\n\nWrite a Python solution. Reply with the code in one ```python code block."


def choice_prompt(question: str, options: list[str]) -> str:
    lines = [str(question).strip(), ""]
    lines += [f"{LETTERS[i]}) {str(o).strip()}" for i, o in enumerate(options)]
    lines += ["", "Answer with the letter of the correct option, e.g. 'The answer is (A)'."]
    return "\n".join(lines)


def _mc(question: str, options: list[str], gold_index: int) -> Example:
    if not 0 <= gold_index < len(options):
        raise ValueError(f"gold option index {gold_index} is outside the {len(options)} options")
    return choice_prompt(question, options), LETTERS[gold_index], {"options": list(options)}


def _letter_index(answer: Any, labels: list[str] | None = None) -> int:
    if isinstance(answer, int):
        return answer
    a = str(answer).strip()
    if labels and a in labels:
        return labels.index(a)
    return int(a) - 1 if a.isdigit() else LETTERS.index(a.upper())


def _hendrycks(row: dict[str, Any]) -> Example:
    gold = row.get("answer") or extract_boxed(first_field(row, "solution"))
    if gold is None:
        raise ValueError("no 'answer' and no \\boxed{} answer in 'solution'")
    return MATH_PROMPT.format(question=first_field(row, "problem", "question")), format_number(gold), {}


def _theoremqa(row: dict[str, Any]) -> Example:
    return MATH_PROMPT.format(question=first_field(row, "Question", "question")), \
        format_number(first_field(row, "Answer", "answer")), {}


def _mmlu(row: dict[str, Any]) -> Example:
    return _mc(row["question"], list(row["choices"]), _letter_index(row["answer"]))


def _mmlu_pro(row: dict[str, Any]) -> Example:
    return _mc(row["question"], list(row["options"]), _letter_index(row["answer"]))


def _gpqa(row: dict[str, Any]) -> Example:
    correct = str(row["Correct Answer"]).strip()
    options = [correct] + [str(row[f"Incorrect Answer {i}"]).strip() for i in (1, 2, 3)]
    random.Random(str(row["Question"])).shuffle(options)
    return _mc(row["Question"], options, options.index(correct))


def _arc_like(row: dict[str, Any]) -> Example:
    choices = row["choices"]
    labels, texts = list(choices["label"]), list(choices["text"])
    return _mc(first_field(row, "question", "question_stem"), texts, _letter_index(row["answerKey"], labels))


def _hellaswag(row: dict[str, Any]) -> Example:
    return _mc(f"Which ending fits best?\n{row['ctx']}", list(row["endings"]), int(row["label"]))


def _truthfulqa(row: dict[str, Any]) -> Example:
    mc = row["mc1_targets"]
    return _mc(row["question"], list(mc["choices"]), list(mc["labels"]).index(1))


def _winogrande(row: dict[str, Any]) -> Example:
    return _mc(f"Fill in the blank: {row['sentence']}", [row["option1"], row["option2"]], int(row["answer"]) - 1)


def _mbpp(row: dict[str, Any]) -> Example:
    tests = list(first_field(row, "test_list"))
    question = f"{first_field(row, 'text', 'prompt')}\nYour code should pass these tests:\n" + "\n".join(tests)
    setup = row.get("test_setup_code") or ""
    return CODE_PROMPT.format(question=question), row.get("code", ""), {"test": setup + "\n" + "\n".join(tests)}


def _humaneval_like(row: dict[str, Any]) -> Example:
    from rllm_core.benchmarks.humaneval import humaneval_instruction

    prompt = row["prompt"]
    return humaneval_instruction(prompt), prompt + row.get("canonical_solution", ""), {
        "test": row["test"], "entry_point": row["entry_point"], "prompt": prompt}


def _livecodebench(row: dict[str, Any]) -> Example:
    cases = row["public_test_cases"]
    cases = json.loads(cases) if isinstance(cases, str) else cases
    stdin_cases = [c for c in cases if c.get("testtype", "stdin") == "stdin"]
    return CODE_PROMPT.format(question=row["question_content"]), "", {"cases": stdin_cases}


def _finqa(row: dict[str, Any]) -> Example:
    pre = " ".join(row.get("pre_text") or []) if isinstance(row.get("pre_text"), list) else row.get("pre_text", "")
    post = " ".join(row.get("post_text") or []) if isinstance(row.get("post_text"), list) else row.get("post_text", "")
    table = "\n".join(" | ".join(map(str, r)) for r in row.get("table") or [])
    question = f"{pre}\n{table}\n{post}\n\nQuestion: {row['question']}"
    return MATH_PROMPT.format(question=question), format_number(first_field(row, "answer", "final_result")), {}


def hub_benchmarks() -> list[DatasetBenchmark]:
    b = DatasetBenchmark
    mc, math, code = "multiple_choice", "math", "code"
    return [
        b("hendrycks_math", category=math, grader="math", convert=_hendrycks, required=("problem", "solution"),
          splits=("train", "test"), hub_id="DigitalLearningGmbH/MATH-lighteval",
          rows_hint={"train": 7500, "test": 5000}, description="Hendrycks MATH (all subjects)"),
        b("math_hard", category=math, grader="math", convert=_hendrycks, required=("problem", "solution"),
          splits=("train", "test"), hub_id="lighteval/MATH-Hard", description="MATH level-5 problems"),
        b("deepscaler", category=math, grader="math", convert=_hendrycks, required=("problem", "answer"),
          splits=("train",), hub_id="agentica-org/DeepScaleR-Preview-Dataset", rows_hint={"train": 40315},
          description="rLLM's DeepScaleR math training set"),
        b("aime25", category=math, grader="math", convert=_hendrycks, required=("problem", "answer"),
          hub_id="math-ai/aime25", rows_hint={"test": 30}, description="AIME 2025"),
        b("theoremqa", category=math, grader="math", convert=_theoremqa, required=(("Question", "question"),),
          hub_id="TIGER-Lab/TheoremQA", rows_hint={"test": 800}, description="TheoremQA"),
        b("finqa", category=math, grader="math", convert=_finqa, required=("question", "answer"),
          splits=("train", "test"), hub_id="dreamerdeo/finqa", description="FinQA: numeric reasoning over reports"),
        b("mmlu", category=mc, grader="choice", convert=_mmlu, required=("question", "choices", "answer"),
          hub_id="cais/mmlu", hub_config="all", rows_hint={"test": 14042}, description="MMLU"),
        b("mmlu_pro", category=mc, grader="choice", convert=_mmlu_pro, required=("question", "options", "answer"),
          hub_id="TIGER-Lab/MMLU-Pro", rows_hint={"test": 12032}, description="MMLU-Pro (10 options)"),
        b("gpqa_diamond", category=mc, grader="choice", convert=_gpqa, required=("Question", "Correct Answer"),
          hub_id="Idavidrein/gpqa", hub_config="gpqa_diamond", hub_splits={"test": "train"},
          rows_hint={"test": 198}, description="GPQA Diamond (gated on the Hub: accept its terms first)"),
        b("arc_challenge", category=mc, grader="choice", convert=_arc_like,
          required=("question", "choices", "answerKey"),
          hub_id="allenai/ai2_arc", hub_config="ARC-Challenge", rows_hint={"test": 1172}, description="ARC Challenge"),
        b("arc_easy", category=mc, grader="choice", convert=_arc_like, required=("question", "choices", "answerKey"),
          hub_id="allenai/ai2_arc", hub_config="ARC-Easy", rows_hint={"test": 2376}, description="ARC Easy"),
        b("commonsense_qa", category=mc, grader="choice", convert=_arc_like,
          required=("question", "choices", "answerKey"), hub_id="tau/commonsense_qa",
          hub_splits={"test": "validation"}, rows_hint={"test": 1221}, description="CommonsenseQA (validation)"),
        b("openbookqa", category=mc, grader="choice", convert=_arc_like,
          required=("question_stem", "choices", "answerKey"), hub_id="allenai/openbookqa", hub_config="main",
          rows_hint={"test": 500}, description="OpenBookQA"),
        b("hellaswag", category=mc, grader="choice", convert=_hellaswag, required=("ctx", "endings", "label"),
          hub_id="Rowan/hellaswag", hub_splits={"test": "validation"}, rows_hint={"test": 10042},
          description="HellaSwag (validation)"),
        b("truthfulqa_mc1", category=mc, grader="choice", convert=_truthfulqa, required=("question", "mc1_targets"),
          hub_id="truthfulqa/truthful_qa", hub_config="multiple_choice", hub_splits={"test": "validation"},
          rows_hint={"test": 817}, description="TruthfulQA MC1"),
        b("winogrande", category=mc, grader="choice", convert=_winogrande,
          required=("sentence", "option1", "option2", "answer"), hub_id="allenai/winogrande",
          hub_config="winogrande_xl", hub_splits={"test": "validation"}, rows_hint={"test": 1267},
          description="WinoGrande (validation)"),
        b("mbpp", category=code, grader="code", convert=_mbpp, required=(("text", "prompt"), "test_list"),
          hub_id="google-research-datasets/mbpp", rows_hint={"test": 500}, description="MBPP"),
        b("mbpp_plus", category=code, grader="code", convert=_mbpp, required=(("prompt", "text"), "test_list"),
          hub_id="evalplus/mbppplus", rows_hint={"test": 378}, description="MBPP+ (EvalPlus)"),
        b("humaneval_plus", category=code, grader="code", convert=_humaneval_like,
          required=("prompt", "test", "entry_point"), hub_id="evalplus/humanevalplus", rows_hint={"test": 164},
          description="HumanEval+ (EvalPlus)"),
        b("livecodebench", category=code, grader="code_io", convert=_livecodebench,
          required=("question_content", "public_test_cases"), hub_id="livecodebench/code_generation_lite",
          description="LiveCodeBench code generation (stdin/stdout public tests)"),
    ]
