"""Graders: math-verify equivalences, extraction, multiple choice, and the code sandbox's limits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rllm_envs.rewards import (
    SandboxLimits,
    extract_answer,
    extract_boxed,
    extract_choice,
    extract_code,
    grade_choice,
    grade_code,
    grade_math,
    grade_stdio,
    math_equal,
    run_python,
)
from rllm_envs.rewards._time_limit import call_with_time_limit


@pytest.mark.parametrize(("gold", "answer"), [
    ("\\frac{1}{2}", "0.5"),
    ("\\frac{3}{4}", "3/4"),
    ("\\dfrac{1}{2}", "\\frac12"),
    ("3\\sqrt{2}", "\\sqrt{18}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("10", "10 \\text{ cm}"),
    ("90^\\circ", "90"),
    ("27.0", "27"),
    ("1000", "1,000"),
    ("x^2 + 2x + 1", "(x+1)^2"),
])
def test_math_equivalences(gold: str, answer: str) -> None:
    assert math_equal(gold, answer)


@pytest.mark.parametrize(("gold", "answer"), [("\\frac{1}{2}", "0.51"), ("3\\sqrt{2}", "\\sqrt{17}"), ("10", "11")])
def test_math_differences(gold: str, answer: str) -> None:
    assert not math_equal(gold, answer)


def test_grade_math_reasons() -> None:
    assert grade_math("So \\boxed{\\frac{1}{2}}.", "0.5").reason == "correct"
    assert grade_math("So \\boxed{3}.", "0.5").reason == "wrong_answer"
    assert grade_math("no idea", "0.5").reason == "no_answer_extracted"
    assert grade_math("steps...\n#### 1,234", "1234").is_correct
    assert grade_math("3 + 4 = 7", "7", extractor="last_number").extracted == "7"


def test_time_limit() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        call_with_time_limit(time.sleep, 0.2, 1)
    assert time.monotonic() - started < 1
    assert call_with_time_limit(sum, 1, [1, 2]) == 3
    with pytest.raises(ZeroDivisionError):
        call_with_time_limit(lambda: 1 / 0, 1)


def test_time_limit_stops_piling_up_stuck_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm_envs.rewards import _time_limit

    already = _time_limit.stuck_calls()  # an earlier test's overrun may still be sleeping
    monkeypatch.setattr(_time_limit, "MAX_STUCK", already + 2)
    release = __import__("threading").Event()
    try:
        for _ in range(2):
            with pytest.raises(TimeoutError, match="did not finish"):
                call_with_time_limit(release.wait, 0.05, 5)
        with pytest.raises(TimeoutError, match=r"not started: .* earlier calls overran"):
            call_with_time_limit(sum, 1, [1])
    finally:
        release.set()
    deadline = time.monotonic() + 3
    while _time_limit.stuck_calls() > already and time.monotonic() < deadline:
        time.sleep(0.01)
    assert call_with_time_limit(sum, 1, [1]) == 1  # once they end, calls run again


def test_extractors() -> None:
    assert extract_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert extract_answer("#### 72", "hash") == "72"
    assert extract_answer("it costs $1,200.", "last_number") == "1200"
    assert extract_answer("<answer> 5 </answer>", "tag") == "5"
    assert extract_choice("The answer is (C).") == "C"
    assert extract_choice("B) because") == "B"
    assert extract_choice("\\boxed{D}") == "D"
    assert extract_code("text\n```python\nx = 1\n```\nmore") == "x = 1\n"


def test_grade_choice() -> None:
    assert grade_choice("The answer is (B)", "B").reason == "correct"
    assert grade_choice("The answer is (A)", "B").reason == "wrong_answer"
    assert grade_choice("hmm", "B").reason == "no_answer_extracted"


def test_grade_code_reasons() -> None:
    test = "def check(f):\n    assert f(2) == 4\n"
    assert grade_code("```python\ndef sq(x):\n    return x * x\n```", test, "sq").reason == "correct"
    assert grade_code("```python\ndef sq(x):\n    return x + 1\n```", test, "sq").reason == "wrong_answer"
    assert grade_code("```python\ndef sq(x) return\n```", test, "sq").reason == "format_error"
    slow = grade_code("```python\ndef sq(x):\n    while True: pass\n```", test, "sq", limits=SandboxLimits(timeout_s=1))
    assert slow.reason == "timeout"
    cases = [{"input": "3\n", "output": "6\n"}]
    assert grade_stdio("```python\nprint(int(input()) * 2)\n```", cases).is_correct
    assert grade_stdio("```python\nprint(int(input()) * 3)\n```", cases).reason == "wrong_answer"


def test_sandbox_cannot_write_outside(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    res = run_python(f"open({str(target)!r}, 'w').write('x')")
    assert res.status == "failed" and "blocked" in res.stderr
    assert not target.exists()
    res = run_python(f"import os\nos.remove({str(tmp_path)!r})")
    assert res.status == "failed"
    inside = run_python("open('ok.txt', 'w').write('fine'); print(open('ok.txt').read())")
    assert inside.passed and inside.stdout.strip() == "fine"


def test_sandbox_cannot_open_socket() -> None:
    res = run_python("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))")
    assert res.status == "failed" and "network access is blocked" in res.stderr


def test_sandbox_memory_limit() -> None:
    res = run_python("x = bytearray(2 * 1024 ** 3)", SandboxLimits(memory_mb=256))
    assert res.status == "failed" and "MemoryError" in res.stderr


def test_sandbox_timeout_kills_children(tmp_path: Path) -> None:
    marker = tmp_path / "pid.txt"
    program = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    res = run_python(program, SandboxLimits(timeout_s=1.5, allow_subprocess=True))
    assert res.status == "timeout"
    assert time.monotonic() - started < 10
    child_pid = int(res.stdout.split()[0])
    time.sleep(0.2)
    assert not _alive(child_pid)  # the grandchild died with its process group
    del marker


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a reaper: PID 1 here does not reap)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state not in ("Z", "X")


def test_sandbox_blocks_processes_by_default() -> None:
    res = run_python("import subprocess\nsubprocess.run(['true'])")
    assert res.status == "failed" and "starting processes is blocked" in res.stderr


def test_sandbox_output_is_capped_by_file_size_limit() -> None:
    res = run_python("import sys\nwhile True: sys.stdout.write('x' * 65536)", SandboxLimits(file_size_mb=1))
    # Python ignores SIGXFSZ, so the write fails with EFBIG instead of the process being killed.
    assert res.status == "failed" and "File too large" in res.stderr and len(res.stdout) <= 64 * 1024


def test_extract_code_language_tags() -> None:
    reply = "Here:\n```python3\nprint(1)\n```\nIt prints:\n```text\n1\n```"
    assert extract_code(reply) == "print(1)\n"  # the Python block, not the later output block
    assert extract_code("```py\nx = 2\n```") == "x = 2\n"
    assert extract_code("```\nx = 3\n```") == "x = 3\n"
    assert extract_code("```js\nlet x\n```") == "let x\n"  # no Python block: the last block of any language
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off mid-block
    assert extract_code("no code at all") is None


def test_extract_choice_ignores_lowercase_words_and_reads_markdown() -> None:
    assert extract_choice("The answer is a bit tricky to find.") is None
    assert extract_choice("**Answer:** C") == "C"
    assert extract_choice("ANSWER IS (D)") == "D"
    assert extract_choice("Option (A) looks wrong; (B) is right.") == "B"
    assert grade_choice("The answer is a guess", "A").reason == "no_answer_extracted"


def test_grade_code_body_only_completion() -> None:
    """A completion-style reply (just the indented body) is valid once appended to the prompt's signature."""
    prompt = "def sq(x):\n    \"\"\"Square x.\"\"\"\n"
    test = "def check(f):\n    assert f(3) == 9\n"
    assert grade_code("    return x * x\n", test, "sq", prompt).reason == "correct"
    assert grade_code("    return x + x\n", test, "sq", prompt).reason == "wrong_answer"
    assert grade_code("    return x *\n", test, "sq", prompt).reason == "format_error"
    assert grade_code("   ", test, "sq", prompt).reason == "no_answer_extracted"


def test_reasoning_gym_reasons() -> None:
    from rllm_envs.benchmarks import get_benchmark

    bench = get_benchmark("basic_arithmetic")
    task = bench.load("test", max_examples=1)[0]
    assert bench.grade(task, f"<answer>{task.ground_truth}</answer>").reason == "correct"
    assert bench.grade(task, str(task.ground_truth)).reason == "correct"  # right without tags still counts
    assert bench.grade(task, "<answer>-123456789</answer>").reason == "wrong_answer"
    untagged = bench.grade(task, "I think it is -123456789")
    assert untagged.reason == "format_error" and "tag" in untagged.details["note"]
    assert bench.grade(task, "  ").reason == "no_answer_extracted"


def test_humaneval_whole_function_reply_keeps_the_prompts_helpers() -> None:
    """HumanEval/38's prompt defines `encode_cyclic`, which its tests call: a reply with only `decode_cyclic`
    must still be run next to it."""
    from rllm_envs.benchmarks import get_benchmark

    bench = get_benchmark("humaneval")
    task = bench.load()[38]
    assert "def encode_cyclic" in task.metadata["prompt"]
    solution = str(task.ground_truth)[len(task.metadata["prompt"]):]
    reply = f"```python\ndef decode_cyclic(s: str):\n{solution}```"
    assert bench.grade(task, reply).reason == "correct"
    assert bench.grade(task, "```python\ndef decode_cyclic(s: str):\n    return s\n```").reason == "wrong_answer"


def test_grade_math_timeout_and_grader_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A math-verify call that hangs is cut off as `timeout` on time; one that raises is `error`, not a crash."""
    import rllm_envs.rewards.math as math_mod

    monkeypatch.setattr(math_mod, "_verify", lambda gold, answer: time.sleep(3))
    started = time.monotonic()
    slow = grade_math("\\boxed{\\sqrt{2}}", "\\frac{2}{\\sqrt{2}}", timeout_s=0.2)
    assert slow.reason == "timeout" and slow.reward == 0.0 and time.monotonic() - started < 1.5

    def broken(gold: str, answer: str) -> bool:
        raise RecursionError("sympy went too deep")

    monkeypatch.setattr(math_mod, "_verify", broken)
    failed = grade_math("\\boxed{\\sqrt{2}}", "\\frac{2}{\\sqrt{2}}")
    assert failed.reason == "error" and "RecursionError" in failed.details["note"]
