"""Memory per step and disk per run of the README's main job, as a user runs it.

    python benchmarks/train_memory.py                          # rllm train arithmetic --max-steps 60 (~15 min)
    python benchmarks/train_memory.py --max-steps 12           # shorter: the first steps and the plateau
    python benchmarks/train_memory.py --model tiny-random --max-steps 6   # seconds, for a smoke run
    python benchmarks/train_memory.py --json mem.json -- --lora-rank 16  # after --: more `rllm train` flags

`rllm train` runs as a subprocess (a fresh interpreter, so nothing this script imported is counted); the RSS
of its whole process tree is sampled every 0.25 s and each sample is assigned to the training step whose line
`metrics.jsonl` had last written. Printed: the peak RSS while each step ran, the overall peak, the growth after
step 5 (median of steps 5–10 against the median of the last 10; also step 5 against the last step alone; the
issue's goal: peak ≤ 4 GB, flat after step 5 within ±5 %), and the bytes the run
directory holds at the end, split into checkpoints (weights vs optimizer state), episodes and the rest.
The CPU flags are printed beside the figures: a bf16 machine trains in bf16 (the benchmark's recommendation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rllm_core.cpu_features import matmul_flags

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_servers import RssSampler, split_passthrough  # a sibling script, not a package

GIB = 2**30




def _last_step(metrics: Path) -> int:
    """The newest training step `metrics.jsonl` holds (0 before the first)."""
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("kind") == "train":
            return int(record["step"])
    return 0


def disk_usage(run: Path) -> dict[str, int]:
    """Bytes of the run directory by kind: checkpoint weights, optimizer/trainer state, episodes, the rest."""
    usage = {"checkpoint weights": 0, "optimizer + trainer state": 0, "episodes": 0, "other": 0}
    for f in run.rglob("*"):
        if not f.is_file():
            continue
        size = f.stat().st_size
        rel = f.relative_to(run).parts
        if rel[0] == "checkpoints":
            state = f.name in ("trainer_state.pt", "trainer.pt")
            usage["optimizer + trainer state" if state else "checkpoint weights"] += size
        elif rel[0] == "episodes":
            usage["episodes"] += size
        else:
            usage["other"] += size
    return usage


def window_growth(per_step: dict[int, int], last: int) -> float:
    """The trend after step 5: the median per-step peak of steps 5–10 against that of the last 10 steps, in %.

    A step's peak RSS scatters ±3 % around its neighbours' with the same workload (when the sampler, the update
    and the allocator's trims happen to meet), so two single steps measure that scatter as much as a trend."""
    early = [per_step[s] for s in range(5, 11) if s in per_step]
    late = [per_step[s] for s in range(max(11, last - 9), last + 1) if s in per_step]
    if not early or not late:
        return float("nan")
    return (statistics.median(late) / statistics.median(early) - 1) * 100


def measure(cmd: list[str], run: Path, log_path: Path, interval: float = 0.25) -> tuple[int, float, dict[int, int]]:
    """Run `cmd`; (exit code, wall seconds, peak RSS bytes of the process tree per step: 0 = set-up)."""
    per_step: dict[int, int] = {}
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        done = threading.Event()
        sampler = RssSampler(proc.pid, interval)

        def watch() -> None:
            while not done.wait(interval):
                rss, _ = sampler.sample()
                step = _last_step(run / "metrics.jsonl") + 1  # the step being run now
                per_step[step] = max(per_step.get(step, 0), rss)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        try:
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            done.set()
            thread.join()
    return rc, time.perf_counter() - start, per_step


def main(argv: list[str] | None = None) -> int:
    own, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchmark", default="arithmetic")
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M")
    ap.add_argument("--keep", type=Path, default=None, help="write the run here and keep it (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args(own)
    with tempfile.TemporaryDirectory(prefix="rllm-train-mem-") as tmp:
        run = args.keep or Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rllm", "train", args.benchmark, "--max-steps", str(args.max_steps),
               "--output", str(run), "--no-progress"]
        if args.model:
            cmd += ["--model", args.model]
        cmd += extra
        print(f"CPU flags: {matmul_flags()}  ·  {os.cpu_count()} cores")
        print("+ " + " ".join(cmd[2:]), flush=True)
        rc, wall, per_step = measure(cmd, run, Path(tmp) / "train.log")
        if rc != 0:
            print((Path(tmp) / "train.log").read_text(errors="replace")[-3000:])
            print(f"rllm train exited {rc}")
            return 2
        usage = disk_usage(run)
    steps = sorted(per_step)
    print(f"\n{'step':>5}  {'peak RSS GiB':>12}   (step 1 includes set-up; 'end': final validation + checkpoint)")
    for s in steps:
        print(f"{s if s <= args.max_steps else 'end':>5}  {per_step[s] / GIB:12.2f}")
    last = max((s for s in steps if s <= args.max_steps), default=0)
    peak = max(per_step.values(), default=0)
    growth = (per_step[last] / per_step[5] - 1) * 100 if 5 in per_step and last > 5 else float("nan")
    trend = window_growth(per_step, last)
    print(f"\npeak RSS {peak / GIB:.2f} GiB (goal ≤ 4)  ·  after step 5: {trend:+.1f} % (median of steps 5–10 → "
          f"median of the last 10; goal ±5 %), step 5 → step {last} alone {growth:+.1f} %"
          f"  ·  wall {wall:.0f} s")
    total = sum(usage.values())
    print(f"run directory {total / 2**20:.0f} MiB: " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in usage.items()))
    if args.json:
        args.json.write_text(json.dumps({"cpu_flags": matmul_flags(), "per_step_rss": per_step, "peak_rss": peak,
                                         "growth_after_step5_pct": growth, "growth_window_medians_pct": trend,
                                         "disk": usage, "wall_s": wall,
                                         "command": cmd[2:]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
