"""MBPP on its real rows (../shared/data/mbpp/mbpp.jsonl, all 974): the splits by task id, every reference solution
of the test split passing the hardened code grader, and what must not pass (an empty or wrong solution, a
builtin-named helper reaching the tests)."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rllm_core.types import Task
from rllm_envs.benchmarks.mbpp import SPLIT_IDS
from rllm_rollout.benchmarks.registry import get_benchmark


@pytest.fixture(scope="module")
def test_tasks() -> dict[int, Task]:
    import os

    data = Path(os.environ.get("RLLM_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
    assert (data / "mbpp" / "mbpp.jsonl").is_file(), f"MBPP rows not found under {data}; set RLLM_DATA_DIR"
    return {t.metadata["task_id"]: t for t in get_benchmark("mbpp").load("test", str(data))}


def test_the_splits_are_the_task_id_ranges(shared_data_dir: Path, test_tasks: dict[int, Task]) -> None:
    bench = get_benchmark("mbpp")
    assert sorted(test_tasks) == list(range(11, 511)) and bench.rows("test") == 500
    for split, ids in SPLIT_IDS.items():
        assert [t.metadata["task_id"] for t in bench.load(split, str(shared_data_dir))] == list(ids)
    first = test_tasks[11]
    assert "remove_Occ" in str(first.instruction) and first.metadata["test"].count("assert") == 3


@pytest.mark.slow
def test_every_reference_solution_passes(test_tasks: dict[int, Task]) -> None:
    bench = get_benchmark("mbpp")
    tasks = list(test_tasks.values())
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: bench.grade(t, bench.reference_response(t)), tasks))
    failed = {t.metadata["task_id"]: r.details.get("note") for t, r in zip(tasks, results, strict=True)
              if r.reason != "correct"}
    assert not failed, failed
    assert Counter(r.reward for r in results) == {1.0: 500}


def test_empty_and_wrong_solutions_score_zero(test_tasks: dict[int, Task]) -> None:
    bench = get_benchmark("mbpp")
    empty = bench.grade(test_tasks[11], "```python\n\n```")
    assert (empty.reward, empty.reason) == (0.0, "no_answer_extracted")
    assert bench.grade(test_tasks[11], "```python\ndef remove_Occ(s, ch):\n    return s\n```").reward == 0.0


def test_a_function_named_like_a_builtin_is_the_one_under_test(test_tasks: dict[int, Task]) -> None:
    """MBPP 126 asks for `sum(a, b)`: the asserts' top calls reach the solution's `sum`; a wrong one fails."""
    bench = get_benchmark("mbpp")
    assert bench.grade(test_tasks[126], bench.reference_response(test_tasks[126])).reason == "correct"
    assert bench.grade(test_tasks[126], "```python\ndef sum(a, b):\n    return 6\n```").reason == "wrong_answer"


def test_a_builtin_wrapper_in_the_tests_never_reaches_the_solution() -> None:
    """`assert len(f(x)) == 3` must not pass on a solution that redefines `len`: the builtin-named binding is only
    for tests that name nothing else of the solution's."""
    from rllm_envs.rewards.code import grade_code

    hack = "```python\ndef len(x):\n    return 3\ndef f(x):\n    return []\n```"
    assert grade_code(hack, "assert len(f(1)) == 3").reason == "wrong_answer"
    honest = "```python\ndef f(x):\n    return [x, x, x]\n```"
    assert grade_code(honest, "assert len(f(1)) == 3").reason == "correct"


def test_setup_that_builds_the_solutions_objects_runs_beside_them(test_tasks: dict[int, Task]) -> None:
    """MBPP 367's setup builds trees of the solution's own `Node`; the tests hold handles to them."""
    bench = get_benchmark("mbpp")
    assert bench.grade(test_tasks[367], bench.reference_response(test_tasks[367])).reason == "correct"
    always = ("```python\nclass Node:\n    def __init__(self, d):\n        self.data, self.left, self.right = d, None, "
              "None\ndef is_tree_balanced(root):\n    return True\n```")
    assert bench.grade(test_tasks[367], always).reason == "wrong_answer"
