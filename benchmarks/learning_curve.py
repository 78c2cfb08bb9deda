"""Learning curve: `rllm train arithmetic` with the embedded SmolLM2-135M for a fixed wall-clock budget.

Held-out accuracy (sampled at the training temperature, and greedy) is measured before training, every
`--eval-every` steps and after; the curve is saved as JSON and PNG. Goal on CPU: held-out sampled accuracy
up ≥ 15 points within 45 minutes.

    python benchmarks/learning_curve.py --minutes 45                      # the full measurement
    python benchmarks/learning_curve.py --minutes 5 --eval-examples 32    # a short check

It runs the real CLI in a subprocess (`rllm train ...`), then reads the run directory's metrics.jsonl.

Measured (2 shared CPU cores, bf16 autocast, 8 tasks × 4 samples × ≤12 tokens, lr 5e-6, 14 min budget):
45 steps; held-out sampled accuracy 12.5% → 96.6% (+84 points, 22 tasks × 4 samples), greedy 68% → 100%
(benchmarks/results/learning_curve_14min/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def train_cmd(args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "rllm", "train", args.benchmark, "--model", args.model, "--output", str(run_dir),
        "--max-steps", str(args.max_steps), "--max-minutes", str(args.minutes),
        "--batch-size", str(args.batch_size), "--group-size", str(args.group_size),
        "--max-tokens", str(args.max_tokens), "--lr", str(args.lr), "--temperature", str(args.temperature),
        "--eval-every", str(args.eval_every), "--eval-examples", str(args.eval_examples), "--eval-greedy",
        "--eval-attempts", str(args.eval_attempts),
        "--micro-batch-size", str(args.micro_batch_size), "--save-every", str(args.eval_every),
        "--algo", args.algo, "--warmup-steps", "2", "--seed", str(args.seed),
        *(["--bf16"] if args.bf16 else []),
    ]


def read_curve(run_dir: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in records if r["kind"] == "eval"]
    train = [r for r in records if r["kind"] == "train"]
    return {
        "eval": [{"step": r["step"], "sampled_accuracy": r.get("val/reward/accuracy"),
                  "greedy_accuracy": r.get("val_greedy/reward/accuracy"),
                  "response_tokens": r.get("val/episode/response_tokens_mean")} for r in evals],
        "train": [{"step": r["step"], "reward_mean": r.get("reward/mean"), "accuracy": r.get("reward/accuracy"),
                   "seconds": r.get("time/step_s"), "approx_kl": r.get("train/approx_kl"),
                   "entropy": r.get("train/entropy"), "skipped": r.get("skipped")} for r in train],
    }


def plot(curve: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ev = curve["eval"]
    ax.plot([e["step"] for e in ev], [e["sampled_accuracy"] for e in ev], "o-", label="held-out, sampled")
    ax.plot([e["step"] for e in ev], [e["greedy_accuracy"] for e in ev], "s-", label="held-out, greedy")
    tr = curve["train"]
    ax.plot([t["step"] for t in tr], [t["accuracy"] for t in tr], alpha=0.4, label="train batch accuracy")
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(curve.get("title", "learning curve"))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--benchmark", default="arithmetic")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--minutes", type=float, default=45.0)
    ap.add_argument("--max-steps", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--micro-batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-examples", type=int, default=64)
    ap.add_argument("--eval-attempts", type=int, default=4, help="sampled attempts per held-out task")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/learning_curve")
    args = ap.parse_args()

    out = Path(args.out)
    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # this script's own previous run: a measurement starts fresh
    out.mkdir(parents=True, exist_ok=True)
    cmd = train_cmd(args, run_dir)
    print("running:", " ".join(cmd), flush=True)
    started = time.time()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(cmd, env=env)
    curve = read_curve(run_dir)
    curve.update({"title": f"{args.model} on {args.benchmark}, {args.algo}, {args.minutes:g} min budget",
                  "setup": vars(args), "wall_s": time.time() - started, "exit_code": proc.returncode})
    if curve["eval"]:
        first, last = curve["eval"][0], curve["eval"][-1]
        curve["sampled_gain_points"] = 100 * ((last["sampled_accuracy"] or 0) - (first["sampled_accuracy"] or 0))
        curve["greedy_gain_points"] = 100 * ((last["greedy_accuracy"] or 0) - (first["greedy_accuracy"] or 0))
    (out / "curve.json").write_text(json.dumps(curve, indent=2))
    plot(curve, out / "curve.png")
    print(json.dumps({k: curve.get(k) for k in ("sampled_gain_points", "greedy_gain_points", "wall_s")}))
    print(f"curve → {out / 'curve.json'} and {out / 'curve.png'}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
