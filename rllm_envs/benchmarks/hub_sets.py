"""Hub-only benchmarks: loaded with `datasets` from their Hugging Face id, or from local JSONL in the same
layout (`<data_dir>/<name>/<split>.jsonl`) when the Hub is out of reach.

Multiple-choice sets are shown with lettered options and graded by letter; code sets run their tests in
the sandbox. Option order is fixed per row (GPQA's shuffle is seeded by the question) so reruns compare.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import random
import re
import zlib
from typing import Any

from rllm_envs.benchmarks.dataset import DatasetBenchmark, Example
from rllm_envs.benchmarks.math_sets import MATH_PROMPT, first_field, format_number
from rllm_envs.benchmarks.mbpp import MBPPBenchmark
from rllm_envs.rewards.extract import extract_boxed

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
    """The prompt shows the first test only (as bigcode-evaluation-harness and EvalPlus do): it names the
    function and its signature, and the other asserts are not there to be hard-coded. All are graded."""
    tests = [str(t) for t in first_field(row, "test_list") if str(t).strip()]
    if not tests:
        raise ValueError("no tests in 'test_list' (an empty test list is an error, never a pass)")
    question = f"{first_field(row, 'text', 'prompt')}\nYour code should pass tests like this one:\n{tests[0]}"
    setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or [])
    return CODE_PROMPT.format(question=question), row.get("code", ""), {"test": "\n".join(tests), "setup": setup}


def _humaneval_like(row: dict[str, Any]) -> Example:
    from rllm_envs.benchmarks.humaneval import humaneval_instruction

    prompt = row["prompt"]
    return humaneval_instruction(prompt), prompt + row.get("canonical_solution", ""), {
        "test": row["test"], "entry_point": row["entry_point"], "prompt": prompt}


def _livecodebench(row: dict[str, Any]) -> Example:
    """A row of livecodebench/code_generation_lite: public and private tests (the private ones compressed),
    "stdin" or "functional" (LeetCode: `metadata.func_name` on class Solution, starting from `starter_code`)."""
    meta = row.get("metadata") or {}
    meta = json.loads(meta) if isinstance(meta, str) else meta
    fn_name = meta.get("func_name")
    cases = []
    for case in _livecodebench_tests(row["public_test_cases"]) + _livecodebench_tests(row.get("private_test_cases")):
        testtype = str(case.get("testtype", "stdin"))
        if testtype == "functional" and not fn_name:
            raise ValueError("a functional test but no metadata.func_name to call")
        cases.append({"input": str(case["input"]), "output": str(case["output"]), "testtype": testtype,
                      **({"fn_name": fn_name} if testtype == "functional" else {})})
    if not cases:
        raise ValueError("no public or private test cases (an empty test list is an error, never a pass)")
    starter = str(row.get("starter_code") or "").strip()
    how = (f"Complete this starter code:\n```python\n{starter}\n```\nReply with the whole solution in one ```python "
           "code block." if starter else "Read the input from stdin and write the answer to stdout. Reply with "
           "the code in one ```python code block.")
    return f"{row['question_content']}\n\n{how}", "", {
        "cases": cases, **{k: row[k] for k in ("question_id", "platform", "difficulty") if k in row}}


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: LiveCodeBench tests are a pickled string")


def _livecodebench_tests(field: Any) -> list[dict[str, Any]]:
    """Tests as LiveCodeBench stores them: a JSON list, or base64(zlib(pickle(JSON text))) for the private
    ones. Unpickled without globals, so a crafted file cannot run code here."""
    if isinstance(field, list):
        return field
    text = str(field or "").strip()
    if not text:
        return []
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        data = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(text.encode("utf-8"))))).load()
        return json.loads(data)


class _LiveCodeBenchFiles(DatasetBenchmark):
    """The Hub repo is a loading script, which this `datasets` no longer runs: read its JSONL files (test.jsonl,
    test2.jsonl, ...: release_latest) one by one, stopping once `max_examples` rows are in."""

    def _load_hub(self, split: str, max_examples: int | None, root: Any) -> list[dict[str, Any]]:
        from rllm_core.errors import BenchmarkError
        from rllm_rollout.benchmarks.data import hub_unreachable

        needs = f"benchmark {self.name!r} needs the files of the Hugging Face dataset {self.hub_id!r}"
        if (unreachable := hub_unreachable()) is not None:
            raise BenchmarkError(f"{needs}, and {unreachable}. Put the rows as JSONL at "
                                 f"<data_dir>/{self.folder}/{split}.jsonl and pass --data-dir instead.")
        try:
            import huggingface_hub as hub

            names = [f for f in hub.list_repo_files(str(self.hub_id), repo_type="dataset")
                     if re.fullmatch(r"test\d*\.jsonl", f)]
            rows: list[dict[str, Any]] = []
            for name in sorted(names, key=lambda f: int(re.sub(r"\D", "", f) or 1)):
                with open(hub.hf_hub_download(str(self.hub_id), name, repo_type="dataset"), encoding="utf-8") as f:
                    for line in f:
                        if max_examples is not None and len(rows) >= max_examples:
                            return rows
                        if line.strip():
                            rows.append(json.loads(line))
        except Exception as exc:
            raise BenchmarkError(f"{needs}, which could not be read ({type(exc).__name__}: {str(exc)[:200]})") from exc
        return rows


def _image_url(image: Any) -> str:
    """A Hub image (a PIL image as `datasets` decodes it, or its {"bytes": ...} form) as a PNG data URL; in a local
    JSONL file, a data URL (kept) or an image file's path."""
    if isinstance(image, str) and image.startswith("data:image/"):
        return image
    if isinstance(image, dict | str):
        from PIL import Image

        image = Image.open(io.BytesIO(image["bytes"]) if isinstance(image, dict) else image)
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _geo3k(row: dict[str, Any]) -> Example:
    """Geometry3K: the problem text (its `<image>` marker where the diagram goes) and the diagram as an image
    part of one user message; graded as math against the answer."""
    images = row.get("images") or []
    if not images:
        raise ValueError("the row has no diagram (images)")
    text = MATH_PROMPT.format(question=str(row["problem"]).replace("<image>", "").strip())
    content = [*({"type": "image_url", "image_url": {"url": _image_url(im)}} for im in images),
               {"type": "text", "text": text}]
    return [{"role": "user", "content": content}], format_number(row["answer"]), {}  # type: ignore[return-value]


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
        b("finqa_text", category=math, grader="math", convert=_finqa, required=("question", "answer"),
          splits=("train", "test"), hub_id="dreamerdeo/finqa",
          description="FinQA as text (tables inlined, one call); `finqa` is the SQL-tool agent"),
        b("geo3k", category="vision", grader="math", convert=_geo3k, required=("problem", "answer", "images"),
          splits=("train", "test"), hub_id="hiyouga/geometry3k", rows_hint={"train": 2101, "test": 601},
          description="Geometry3K: geometry problems with their diagram (an image)"),
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
        MBPPBenchmark("mbpp", category=code, grader="code", convert=_mbpp, required=(("text", "prompt"), "test_list"),
                      splits=("test", "train", "validation", "prompt"), hub_id="google-research-datasets/mbpp",
                      hub_config="full", rows_hint={"test": 500, "train": 374, "validation": 90, "prompt": 10},
                      description="MBPP (all 974 rows; splits by task id: 11-510 test)", code_timeout_s=10.0),
        b("mbpp_plus", category=code, grader="code", convert=_mbpp, required=(("prompt", "text"), "test_list"),
          hub_id="evalplus/mbppplus", rows_hint={"test": 378}, description="MBPP+ (EvalPlus)"),
        b("humaneval_plus", category=code, grader="code", convert=_humaneval_like,
          required=("prompt", "test", "entry_point"), hub_id="evalplus/humanevalplus", rows_hint={"test": 164},
          description="HumanEval+ (EvalPlus)"),
        _LiveCodeBenchFiles("livecodebench", category=code, grader="code_io", convert=_livecodebench,
                            required=("question_content", "public_test_cases"),
                            hub_id="livecodebench/code_generation_lite",
                            description="LiveCodeBench code generation (stdin and functional, public + private tests)"),
    ]
