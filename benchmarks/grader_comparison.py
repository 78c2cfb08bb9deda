"""Our graders against the grading corpus, and our math grader next to math-verify and mathruler on its math part.

    python benchmarks/grader_comparison.py [--examples 8] [--json out.json]

Each grader sees the reply the way its authors use it: ours is `grade_math(response, gold)`; math-verify is
`verify(parse(gold), parse(response))` on the whole reply (its README: it finds the answer itself, and the
order gold-then-answer matters), with the gold answer wrapped in `$...$` so its LaTeX extractor reads it;
mathruler is EasyR1's math reward, `grade_answer(extract_boxed_content(response), gold)` (the PRM800K grader
on the last box). Agreement is with the corpus verdict, the one a careful human grader gives. The table
breaks it down by format tag; then come cases where a grader and the human verdict differ.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rllm_envs.rewards import extract_code, grade_choice, grade_math  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "grading_corpus.jsonl"
GROUPS = ("currency", "percent", "thousands", "fraction", "units", "latex", "boxed", "unboxed", "multiple",
          "think", "shortcut", "arithmetic")
Grader = Callable[[dict[str, Any]], bool]


def ours(case: dict[str, Any]) -> bool:
    return grade_math(case["response"], case["gold"], case.get("extractor", "boxed_or_last_number")).is_correct


def math_verify(case: dict[str, Any]) -> bool:
    from math_verify import parse, verify

    try:
        return bool(verify(parse(f"${case['gold']}$"), parse(case["response"])))
    except Exception:  # a parser crash is a "no" for that grader, as it would be in training
        return False


def mathruler(case: dict[str, Any]) -> bool:
    from mathruler.grader import extract_boxed_content, grade_answer

    try:
        return bool(grade_answer(extract_boxed_content(case["response"]), case["gold"]))
    except Exception:
        return False


def family_accuracy(cases: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """(agreeing, total) per family for our graders; code is right when the extracted block is the right one."""
    def choice(c: dict[str, Any]) -> bool:
        return grade_choice(c["response"], c["gold"], c["letters"]).is_correct is c["expect"]

    def code(c: dict[str, Any]) -> bool:
        got = extract_code(c["response"])
        run = got if got is not None else c["response"]
        if not c["want"]:
            return not run.strip()
        return all(w in run for w in c["want"]) and not any(a in run for a in c["avoid"])

    checks: dict[str, Callable[[dict[str, Any]], bool]] = {
        "math": lambda c: ours(c) is c["expect"], "choice": choice, "code": code}
    out = {}
    for family, check in checks.items():
        rows = [c for c in cases if c["family"] == family]
        out[family] = (sum(check(c) for c in rows), len(rows))
    return out


def _pct(n: int, total: int) -> str:
    return f"{n}/{total} ({100 * n / total:.1f} %)" if total else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=8, help="disagreements to print per grader")
    ap.add_argument("--json", type=Path, help="write the figures and every math verdict here")
    args = ap.parse_args()
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)

    cases = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line]
    fam = family_accuracy(cases)
    print("Our graders on the corpus (agreement with the human verdict):")
    for family, (ok, total) in fam.items():
        print(f"  {family:7} {_pct(ok, total)}")

    graders: dict[str, Grader] = {"ours": ours, "math-verify": math_verify, "mathruler": mathruler}
    math_cases = [c for c in cases if c["family"] == "math"]
    verdicts = {name: [g(c) for c in math_cases] for name, g in graders.items()}
    agree = {name: [v is c["expect"] for v, c in zip(vs, math_cases, strict=True)] for name, vs in verdicts.items()}

    print(f"\nMath, {len(math_cases)} cases (math-verify {version('math-verify')}, mathruler {version('mathruler')}):")
    print(f"  {'tag':12} {'cases':>5}  " + "  ".join(f"{n:>11}" for n in graders))
    for group in ("all", *GROUPS):
        idx = [i for i, c in enumerate(math_cases) if group == "all" or group in c["tags"]]
        cells = "  ".join(f"{sum(agree[n][i] for i in idx):>5} {100 * sum(agree[n][i] for i in idx) / len(idx):>4.0f}%"
                          for n in graders)
        print(f"  {group:12} {len(idx):>5}  {cells}")
    rewarded = {n: sum(v for v, c in zip(vs, math_cases, strict=True) if "shortcut" in c["tags"])
                for n, vs in verdicts.items()}
    shortcuts = sum("shortcut" in c["tags"] for c in math_cases)
    print("  shortcut replies rewarded: " + ", ".join(f"{n} {k}/{shortcuts}" for n, k in rewarded.items()))

    for name in graders:
        wrong = [i for i, ok in enumerate(agree[name]) if not ok]
        print(f"\n{name}: {len(wrong)} verdicts differ from the human one" + (":" if wrong else ""))
        for i in wrong[:args.examples]:
            c = math_cases[i]
            said = "right" if verdicts[name][i] else "wrong"
            print(f"  {c['id']} [{','.join(c['tags'])}] gold {c['gold']!r}, says {said}: {c['response'][:90]!r}")

    if args.json:
        args.json.write_text(json.dumps({
            "families": {f: {"agree": ok, "total": t} for f, (ok, t) in fam.items()},
            "math": {n: {"agree": sum(a), "total": len(a)} for n, a in agree.items()},
            "shortcuts_rewarded": rewarded,
            "cases": [{"id": c["id"], "expect": c["expect"], **{n: verdicts[n][i] for n in graders}}
                      for i, c in enumerate(math_cases)],
        }, indent=1))


if __name__ == "__main__":
    main()
