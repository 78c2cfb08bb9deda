"""Warnings about verifiers that let agent code decide its own verdict (issue 27).

A third-party Harbor task's `tests/test.sh` cannot be rewritten for it, but a user training on it should know
when its reward can be earned without solving the task. Two shapes are flagged, both common in the wild:

- **agent code in the judging process**: a test runner (`pytest`, `python -m unittest`) that imports the agent's
  modules into the very process whose exit status becomes the verdict: an `atexit` handler that calls
  `os._exit(0)` passes every test;
- **an exit status as the verdict**: `if [ $? -eq 0 ]`, `cmd && echo 1 > reward.txt`, where `cmd` runs agent code.

A verifier that runs agent code through an isolation helper (the built-in tasks' `untrusted`, or its own
`unshare`/`setpriv`) is not flagged for the first. The checks read text: they are warnings, not proofs.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["lint_test_sh", "lint_verifier"]

_RUNNER = re.compile(r"(?<![\w-])(?:pytest|py\.test|python3?\s+(?:-\S+\s+)*-m\s+(?:pytest|unittest))(?![\w-])")
_ISOLATED = re.compile(r"\b(?:untrusted|unshare|setpriv|runuser|su\s+-|sudo\s+-u|bwrap|nsjail|firejail)\b")
_RUNS_CODE = r"(?:\bpython3?\b|\bpytest\b|\bbash\b|\bsh\b|\bmake\b|\bnode\b|\bruby\b|\bperl\b|\./)"
_STATUS_VERDICT = re.compile(
    r"\$\?\s*(?:-eq|==|=)\s*0[^\n]*(?:\n[^\n]*){0,3}?echo\s+1\s*>+\s*\S*reward"  # if [ $? -eq 0 ]; then echo 1 > ...
    rf"|{_RUNS_CODE}[^\n]*&&\s*echo\s+1\s*>+\s*\S*reward"                   # python3 x.py && echo 1 > reward.txt
    rf"|\bif\s+[^\[\n;]*{_RUNS_CODE}[^;\n]*;\s*then\s*(?:\n\s*)?echo\s+1\s*>+\s*\S*reward")  # if bash x; then ..


def lint_test_sh(text: str) -> list[str]:
    """Warnings (one line each) for one verifier script's text."""
    lines = [line.split("#", 1)[0] if not line.lstrip().startswith("#!") else "" for line in text.splitlines()]
    code = "\n".join(lines)
    out: list[str] = []
    runners = [i for i, line in enumerate(lines, 1) if _RUNNER.search(line) and not _ISOLATED.search(line)]
    if runners:
        out.append(f"line {runners[0]}: a test runner (pytest/unittest) imports agent code into the judging "
                   "process, so the agent's code can choose its exit status (atexit → os._exit(0)): run agent "
                   "code in a process of its own and judge its output as data")
    if _STATUS_VERDICT.search(code):
        line = code[: _STATUS_VERDICT.search(code).start()].count("\n") + 1  # type: ignore[union-attr]
        out.append(f"line {line}: the reward follows an exit status; when that status comes from a process "
                   "that ran agent code, the agent decides the verdict")
    return out


def lint_verifier(task_dir: Path) -> list[str]:
    """Warnings for the task folder's `tests/test.sh` ([] when it has none: the task loader reports that)."""
    test_sh = Path(task_dir) / "tests" / "test.sh"
    try:
        text = test_sh.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [f"{test_sh}: {w}" for w in lint_test_sh(text)]
