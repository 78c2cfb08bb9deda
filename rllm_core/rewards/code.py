"""Code grading: run the model's program against the benchmark's tests in the sandbox.

The program is the extracted code (the last fenced block, or the raw reply), with the tests appended;
passing means the process exits 0. Reasons: correct, wrong_answer (a test failed, the program crashed or
was killed by a limit), format_error (the code does not parse), no_answer_extracted (empty), timeout.
"""

from __future__ import annotations

from typing import Any

from rllm_core.rewards.extract import extract_code
from rllm_core.rewards.sandbox import SandboxLimits, SandboxResult, run_python
from rllm_core.rewards.types import RewardResult

__all__ = ["grade_code", "grade_stdio", "humaneval_program", "stdio_program"]


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str | None) -> str:
    """The check program. A body-only completion is appended to the prompt. A completion that defines the
    function itself (chat models answer with the whole function) follows the whole prompt, whose stub it
    redefines, so helpers the prompt defines (HumanEval/38's `encode_cyclic`) stay; when the prompt's stub
    does not parse on its own, only the prompt's imports are kept."""
    if entry_point and prompt and f"def {entry_point}" not in completion:
        body = prompt + completion
    elif prompt:
        head = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
        body = f"{prompt.rstrip()}\n\n{completion}"
        if _syntax_error_in(body) is not None:
            body = f"{head}\n{completion}" if head else completion
    else:
        body = completion
    check = f"\n\ncheck({entry_point})\n" if entry_point else "\n"
    return f"{body}\n\n{test}{check}"


def _syntax_error_in(source: str) -> SyntaxError | None:
    try:
        compile(source, "solution.py", "exec")
    except SyntaxError as exc:
        return exc
    return None


def stdio_program(code: str, cases: list[dict[str, Any]]) -> str:
    """A harness that runs `code` once per case with the case's stdin and compares stdout (whitespace-trimmed)."""
    return f'''import io, sys, contextlib
_CODE = {code!r}
_CASES = {[{"input": c.get("input", ""), "output": c.get("output", "")} for c in cases]!r}
for _i, _case in enumerate(_CASES):
    _out = io.StringIO()
    sys.stdin = io.StringIO(_case["input"])
    with contextlib.redirect_stdout(_out):
        exec(compile(_CODE, "solution.py", "exec"), {{"__name__": "__main__"}})
    _got = [l.rstrip() for l in _out.getvalue().strip().splitlines()]
    _want = [l.rstrip() for l in str(_case["output"]).strip().splitlines()]
    assert _got == _want, f"case {{_i}}: expected {{_want!r}}, got {{_got!r}}"
'''


def _code_of(response: str) -> str:
    code = extract_code(response or "")
    return code if code is not None else (response or "")


def _result(code: str, run: SandboxResult) -> RewardResult:
    details = {"status": run.status, "stderr": run.stderr[-2000:], "duration_s": round(run.duration_s, 3)}
    if run.passed:
        return RewardResult.correct(code, **details)
    if run.status == "syntax_error":
        return RewardResult.fail("format_error", code, **details)
    if run.status == "timeout":
        return RewardResult.fail("timeout", code, **details)
    return RewardResult.fail("wrong_answer", code, **details)


def _syntax_error(program: str, code: str) -> RewardResult | None:
    """format_error when the program around the model's code does not parse (checked here, not in the child)."""
    exc = _syntax_error_in(program)
    return None if exc is None else RewardResult.fail("format_error", code, note=f"{type(exc).__name__}: {exc}")


def grade_code(response: str, tests: str, entry_point: str | None = None, prompt: str = "",
               limits: SandboxLimits | None = None) -> RewardResult:
    """Run the reply's code followed by `tests` (and `check(entry_point)` when given, HumanEval style).

    The whole program is what must parse: a body-only completion ("    return x + 1") is valid once it is
    appended to the prompt's signature."""
    code = _code_of(response)
    if not code.strip():
        return RewardResult.fail("no_answer_extracted")
    program = humaneval_program(prompt, code, tests, entry_point)
    return _syntax_error(program, code) or _result(code, run_python(program, limits))


def grade_stdio(response: str, cases: list[dict[str, Any]], limits: SandboxLimits | None = None) -> RewardResult:
    """Competitive-programming style: the program reads stdin and must print the expected output per case."""
    code = _code_of(response)
    if not code.strip():
        return RewardResult.fail("no_answer_extracted")
    return _syntax_error(code, code) or _result(code, run_python(stdio_program(code, cases), limits))
