"""Hub-only benchmarks run from local JSONL in their Hub layout: one synthetic row each, graded both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rllm_envs.benchmarks import get_benchmark

PNG_2X2 = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8//8/AwMDEwMDAwMDAwAkBgMB"
           "/DXemwAAAABJRU5ErkJggg==")
"""A diagram as a local JSONL row of geo3k holds it (a data URL)."""
ROWS: dict[str, tuple[dict[str, Any], str | None, str]] = {
    # name: (row in the Hub's fields, a correct response (None: the reference one), a wrong response)
    "hendrycks_math": ({"problem": "1/2 + 1/4?", "solution": "It is $\\boxed{\\frac{3}{4}}$."}, "\\boxed{0.75}",
                       "\\boxed{1}"),
    "math_hard": ({"problem": "2+2", "solution": "\\boxed{4}"}, None, "\\boxed{5}"),
    "deepscaler": ({"problem": "2+3", "answer": "5", "solution": ""}, None, "\\boxed{6}"),
    "aime25": ({"problem": "p", "answer": "204"}, None, "\\boxed{205}"),
    "theoremqa": ({"Question": "q", "Answer": 3.0}, "\\boxed{3}", "\\boxed{4}"),
    "finqa_text": ({"pre_text": ["Revenue rose."], "post_text": [], "table": [["year", "rev"], ["2020", "10"]],
               "question": "What is rev?", "answer": "10"}, None, "\\boxed{11}"),
    "geo3k": ({"problem": "<image>Find x.", "answer": "6", "images": [PNG_2X2]}, "\\boxed{6}", "\\boxed{7}"),
    "mmlu": ({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 2}, "The answer is (C)", "(A)"),
    "mmlu_pro": ({"question": "q", "options": list("abcdefghij"), "answer": "J"}, "The answer is (J)", "(B)"),
    "gpqa_diamond": ({"Question": "q", "Correct Answer": "yes", "Incorrect Answer 1": "n1",
                      "Incorrect Answer 2": "n2", "Incorrect Answer 3": "n3"}, None, None),  # type: ignore[dict-item]
    "arc_challenge": ({"question": "q", "choices": {"label": ["A", "B"], "text": ["x", "y"]}, "answerKey": "B"},
                      "The answer is (B)", "(A)"),
    "arc_easy": ({"question": "q", "choices": {"label": ["1", "2", "3"], "text": ["x", "y", "z"]}, "answerKey": "3"},
                 "The answer is (C)", "(A)"),
    "commonsense_qa": ({"question": "q", "choices": {"label": list("ABCDE"), "text": list("vwxyz")},
                        "answerKey": "E"}, "The answer is (E)", "(A)"),
    "openbookqa": ({"question_stem": "q", "choices": {"label": list("ABCD"), "text": list("wxyz")},
                    "answerKey": "A"}, "The answer is (A)", "(D)"),
    "hellaswag": ({"ctx": "He opens the door", "endings": ["and walks in", "b", "c", "d"], "label": "0"},
                  "The answer is (A)", "(B)"),
    "truthfulqa_mc1": ({"question": "q", "mc1_targets": {"choices": ["t", "f"], "labels": [1, 0]}},
                       "The answer is (A)", "(B)"),
    "winogrande": ({"sentence": "The _ is big.", "option1": "cat", "option2": "whale", "answer": "2"},
                   "The answer is (B)", "(A)"),
    "mbpp": ({"text": "Double x.", "code": "def dbl(x):\n    return 2 * x", "test_list": ["assert dbl(2) == 4"]},
             None, "```python\ndef dbl(x):\n    return x\n```"),
    "mbpp_plus": ({"prompt": "Double x.", "code": "def dbl(x):\n    return 2 * x",
                   "test_list": ["assert dbl(3) == 6"]}, None, "```python\ndef dbl(x):\n    return 0\n```"),
    "humaneval_plus": ({"prompt": "def inc(x):\n", "canonical_solution": "    return x + 1\n",
                        "test": "def check(f):\n    assert f(1) == 2\n", "entry_point": "inc"},
                       None, "```python\ndef inc(x):\n    return x\n```"),
    "livecodebench": ({"question_content": "Read n, print 2n.",
                       "public_test_cases": json.dumps([{"input": "4\n", "output": "8\n", "testtype": "stdin"}])},
                      "```python\nprint(2 * int(input()))\n```", "```python\nprint(int(input()))\n```"),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_hub_benchmark_from_local_file(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = get_benchmark(name)
    row, right, wrong = ROWS[name]
    split = "test" if "test" in bench.splits else bench.splits[0]
    (tmp_path / name).mkdir()
    (tmp_path / name / f"{split}.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("RLLM_DATA_DIR", str(tmp_path))
    assert bench.offline
    (task,) = bench.load(split)
    assert task.instruction
    good = bench.grade(task, right if right is not None else bench.reference_response(task))
    assert good.reason == "correct", good
    if wrong is None:  # gpqa: options are shuffled, the wrong letter is any other one
        wrong = "(A)" if task.ground_truth != "A" else "(B)"
    bad = bench.grade(task, wrong)
    assert bad.reward == 0.0 and bad.reason == "wrong_answer", bad


def test_every_hub_only_entry_is_covered() -> None:
    from rllm_envs.benchmarks.hub_sets import hub_benchmarks

    assert {b.name for b in hub_benchmarks()} == set(ROWS)


def test_choice_grading_uses_only_the_questions_letters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mmlu").mkdir()
    row = {"question": "q", "choices": ["a", "b", "c", "d"], "answer": 1}
    (tmp_path / "mmlu" / "test.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("RLLM_DATA_DIR", str(tmp_path))
    bench = get_benchmark("mmlu")
    (task,) = bench.load()
    assert bench.grade(task, "The answer is I think (B)").reason == "correct"  # "I" is not an option of A-D
    assert bench.grade(task, "The answer is (E)").reason == "no_answer_extracted"
