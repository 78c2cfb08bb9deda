"""Peak memory and wall time of the plain user eval on the embedded model (our engine), as a user runs it.

    python benchmarks/eval_memory.py --data-dir /work/shared/data          # rllm eval gsm8k --max-examples 40
    python benchmarks/eval_memory.py --benchmark arithmetic --model tiny-random --max-examples 8   # seconds
    python benchmarks/eval_memory.py --json mem.json -- --concurrency 8     # after --: more `rllm eval` flags

`rllm eval` runs as a subprocess (a fresh interpreter, so nothing this script imported is counted); the RSS
of its whole process tree is sampled every 0.2 s. The issue's target is a peak of at most 2.5 GB for
`rllm eval gsm8k --max-examples 40` with SmolLM2-135M served in-process; the exit code is 1 when it is missed
and 2 when the eval itself failed. gsm8k is a Hub benchmark: offline, point --data-dir (or RLLM_DATA_DIR) at
a folder holding gsm8k/test.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_servers import RssSampler, split_passthrough  # a sibling script, not a package


def eval_command(benchmark: str, max_examples: int, out: Path, model: str | None, data_dir: Path | None,
                 extra: list[str]) -> list[str]:
    """`rllm eval BENCH --max-examples N -o OUT` through this interpreter, plus only the flags asked for."""
    cmd = [sys.executable, "-m", "rllm", "eval", benchmark, "--max-examples", str(max_examples), "-o", str(out),
           "--no-progress"]
    if model:
        cmd += ["--model", model]
    if data_dir:
        cmd += ["--data-dir", str(data_dir)]
    return cmd + extra


def measure(cmd: list[str], log_path: Path, interval: float = 0.2) -> tuple[int, float, int, int]:
    """Run `cmd` with its output in `log_path`; (exit code, wall seconds, peak RSS and PSS bytes of its tree)."""
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            with RssSampler(proc.pid, interval) as rss:
                rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    return rc, time.perf_counter() - start, rss.peak, rss.peak_pss


def read_summary(out: Path) -> dict[str, Any]:
    path = out / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main() -> None:
    argv, extra = split_passthrough(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchmark", default="gsm8k")
    ap.add_argument("--max-examples", type=int, default=40)
    ap.add_argument("--model", default=None, help="passed as --model (default: rllm's own choice, smollm2-135m)")
    ap.add_argument("--data-dir", type=Path, default=None, help="passed as --data-dir (default: RLLM_DATA_DIR)")
    ap.add_argument("--target-gb", type=float, default=2.5, help="peak RSS the run must stay under")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    if args.max_examples < 1:
        ap.error("--max-examples must be at least 1")
    out = Path(tempfile.mkdtemp(prefix="rllm-eval-memory-"))
    cmd = eval_command(args.benchmark, args.max_examples, out / "run", args.model, args.data_dir, extra)
    print("running:", " ".join(cmd[2:]), flush=True)
    rc, wall, peak, peak_pss = measure(cmd, out / "eval.log")
    summary = read_summary(out / "run")
    result = {"command": " ".join(["rllm", *cmd[3:]]), "exit_code": rc, "wall_s": round(wall, 2),
              "peak_rss_gb": round(peak / 1e9, 3), "peak_pss_gb": round(peak_pss / 1e9, 3), "target_gb": args.target_gb,
              "episodes": summary.get("n_episodes"), "accuracy": summary.get("accuracy"),
              "completion_tokens": summary.get("completion_tokens"), "eval_wall_s": summary.get("wall_time_s"),
              "log": str(out / "eval.log")}
    print(f"peak RSS {result['peak_rss_gb']:.2f} GB (PSS {result['peak_pss_gb']:.2f}; target <= {args.target_gb} GB: "
          f"{'met' if peak / 1e9 <= args.target_gb else 'MISSED'}), wall {wall:.1f} s, "
          f"{result['episodes']} episodes, accuracy {result['accuracy']}")
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if rc != 0:
        print(f"rllm eval failed (exit {rc}); last lines of {out / 'eval.log'}:\n"
              + (out / "eval.log").read_text(errors="replace")[-2000:], file=sys.stderr)
        raise SystemExit(2)
    if peak / 1e9 > args.target_gb:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
