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

Presets for the agents and workflows of issue 15 (same script, their own flags and output folder):

    python benchmarks/learning_curve.py --preset langgraph-retry        # a LangGraph agent, multi-turn (retries)
    python benchmarks/learning_curve.py --preset langgraph-frozenlake   # the same on FrozenLake 4x4 (no signal at 135M)
    python benchmarks/learning_curve.py --preset solver-judge           # solver-judge on arithmetic, per role
    python benchmarks/learning_curve.py --preset search-hotpotqa        # issue 32: a search agent, reward F1
    python benchmarks/learning_curve.py --preset warmstart-frozenlake   # issue 33: demos → SFT → RL from 0
    python benchmarks/learning_curve.py --preset vision-shapes   # issue 35: a VLM learns from images, offline

A warm-start preset (`--demos N`) first measures the base model (`rllm train --max-steps 0`: the same validation
settings), records N reference demonstrations on the train split (`rllm demos`), fine-tunes on those that passed
(`rllm sft --min-reward 1`), then runs RL from the SFT checkpoint (`rllm train --init`); the x axis counts the
minutes of demos + SFT + RL, the base model at 0.

With a workflow the curve also shows each role's held-out accuracy (`val/role/<role>/accuracy`: for the judge,
how often the answer it picked was right), and the x axis is wall-clock minutes since the run started.
"""

from __future__ import annotations

import argparse
import hashlib
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
        "--bf16" if args.bf16 else "--no-bf16",  # explicit: a benchmark may recommend either
        *(["--workflow", args.workflow] if args.workflow else []), *(["--agent", args.agent] if args.agent else []),
        *(["--roles", args.roles] if args.roles else []), *args.extra,
    ]


PRESETS: dict[str, dict[str, Any]] = {
    # 135M on generated 4x4 maps: a move is one word, so 12 tokens per turn; the history grows (16 turns at most)
    "langgraph-frozenlake": {"benchmark": "frozenlake", "agent": "examples/agents/langgraph_frozenlake.py:agent",
                             "max_tokens": 12, "lr": 5e-6, "eval_every": 10, "eval_examples": 50, "eval_attempts": 2,
                             "micro_batch_size": 8, "bf16": False,
                             "out": "benchmarks/results/learning_curve_langgraph_frozenlake"},
    # the measured pick when FrozenLake gives 135M no signal: answer, be told it is wrong, try again (3 tries)
    "langgraph-retry": {"benchmark": "arithmetic", "agent": "examples/agents/langgraph_retry.py:agent",
                        "max_tokens": 12, "lr": 5e-6, "eval_every": 5, "eval_examples": 40, "eval_attempts": 2,
                        "micro_batch_size": 16, "bf16": False,
                        "out": "benchmarks/results/learning_curve_langgraph_retry"},
    # issue 32: the plain-OpenAI-SDK search agent on HotpotQA; the reward is F1 (val/reward/mean), EM is accuracy.
    # Most groups score 0 everywhere at 135M: --rejection group trains only on groups whose rewards differ
    "search-hotpotqa": {"benchmark": "hotpotqa", "agent": "examples/agents/search_openai.py:agent", "max_tokens": 64,
                        "lr": 5e-6, "eval_every": 10, "eval_examples": 40, "eval_attempts": 1, "micro_batch_size": 4,
                        "bf16": False, "minutes": 40, "extra": ["--rejection", "group"],
                        "out": "benchmarks/results/learning_curve_search_hotpotqa"},
    # issue 33: the embedded model never reaches the goal; SFT on shortest-path demonstrations played by the same
    # LangGraph agent (train maps only: none of them is a held-out map), then GRPO; the whole held-out split (100)
    "warmstart-frozenlake": {"benchmark": "frozenlake", "agent": "examples/agents/langgraph_frozenlake.py:agent",
                             "max_tokens": 12, "lr": 2e-6, "eval_every": 10, "eval_examples": 100, "eval_attempts": 1,
                             "micro_batch_size": 8, "bf16": False, "minutes": 15, "demos": 300, "sft_epochs": 2,
                             "sft_lr": 2e-5, "out": "benchmarks/results/learning_curve_warmstart_frozenlake"},
    # issue 33: the terminal agent on the 12 held-out tasks (the train split's 22 references and 4 renamed variants
    # of each, played as they are and with a look around first, for SFT; 4 sampled attempts per held-out task: best
    # of 4 and mean success)
    "warmstart-terminal": {"benchmark": "terminal", "max_tokens": 384, "lr": 2e-6, "eval_every": 5,
                           "eval_examples": 12, "eval_attempts": 4, "batch_size": 4, "group_size": 4,
                           "micro_batch_size": 4, "bf16": False, "minutes": 25, "demos": 22, "task_variants": 4,
                           "demo_variants": "direct,explore", "sft_epochs": 2, "sft_lr": 2e-5, "sft_batch_size": 4,
                           "out": "benchmarks/results/learning_curve_warmstart_terminal"},
    # issue 35: images in, offline. The embedded SmolLM2 with a seeded random (frozen) vision tower names the figure
    # drawn; chance is 0.25, so what it gains is read from the pixels: reference demos (the answer oracle) → SFT
    # through the processor and vision tower → GRPO
    "vision-shapes": {"benchmark": "geometry-shapes", "model": "smollm2-135m-vision", "max_tokens": 8, "lr": 1e-5,
                      "eval_every": 5, "eval_examples": 100, "eval_attempts": 1, "micro_batch_size": 8,
                      "bf16": False, "minutes": 4, "demos": 200, "sft_epochs": 1, "sft_lr": 5e-5,
                      "out": "benchmarks/results/learning_curve_vision_shapes"},
    "solver-judge": {"benchmark": "arithmetic", "workflow": "solver-judge", "max_tokens": 12, "lr": 5e-6,
                     "eval_every": 10, "eval_examples": 32, "eval_attempts": 2, "micro_batch_size": 16,
                     "bf16": False, "out": "benchmarks/results/learning_curve_solver_judge"},
}
"""Settings of the issue-15 curves; flags given on the command line still win. fp32: in these runs a bf16-autocast
backward on this CPU took minutes for a step fp32 does in seconds."""


def _run(cmd: list[str]) -> float:
    """Run one CLI step (its output shown); its wall seconds. A failing step ends the measurement."""
    print("running:", " ".join(cmd), flush=True)
    started = time.time()
    proc = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode:
        sys.exit(f"{cmd[3]} failed with exit code {proc.returncode}")
    return time.time() - started


def warm_start(args: argparse.Namespace, out: Path) -> tuple[Path, dict[str, Any], float]:
    """Base-model validation, demos, SFT (module docstring): the SFT run, the base point, the seconds of demos+SFT."""
    rllm = [sys.executable, "-m", "rllm"]
    agent = ["--agent", args.agent] if args.agent else []
    variants = args.demo_variants.split(",")
    for name in ("base", "sft", *(f"demos-{v}" for v in variants)):
        shutil.rmtree(out / name, ignore_errors=True)
    _run([*rllm, "train", args.benchmark, "--model", args.model, "--output", str(out / "base"), "--max-steps", "0",
          "--eval-examples", str(args.eval_examples), "--eval-attempts", str(args.eval_attempts), "--eval-greedy",
          "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature), "--no-progress", *agent])
    base = read_curve(out / "base")["eval"][0]
    renamed = ["--task-variants", str(args.task_variants)] if args.task_variants else []
    spent = sum(_run([*rllm, "demos", args.benchmark, "-n", str(args.demos), "-o", str(out / f"demos-{v}"),
                      "--variant", v, "--no-progress", *renamed, *agent]) for v in variants)
    base["leak_check"] = leak_check(out / "base", [out / f"demos-{v}" for v in variants])
    spent += _run([*rllm, "sft", *(str(out / f"demos-{v}") for v in variants), "--min-reward", "1", "--model",
                   args.model, "--max-seq-len", "4096", "--epochs", str(args.sft_epochs), "--lr", str(args.sft_lr),
                   "--batch-size", str(args.sft_batch_size), "-o", str(out / "sft"), "--no-progress"])
    return out / "sft", base, spent


def _instruction_hashes(episodes: Path) -> set[str]:
    hashes = set()
    for line in episodes.read_text().splitlines():
        if line.strip():
            text = str(json.loads(line)["task"]["instruction"]).strip()
            hashes.add(hashlib.sha256(text.encode()).hexdigest())
    return hashes


def leak_check(base_run: Path, demo_runs: list[Path]) -> dict[str, int]:
    """Held-out tasks (the base run's validation episodes) against every demonstrated task, by a hash of the
    instruction: `shared` must be 0, or the curve measures memorised answers."""
    held_out = _instruction_hashes(base_run / "episodes" / "eval_step_0.jsonl")
    shown = set().union(*(_instruction_hashes(run / "episodes.jsonl") for run in demo_runs))
    shared = len(held_out & shown)
    if shared:
        sys.exit(f"{shared} held-out tasks were demonstrated: the warm start would train on them")
    return {"held_out": len(held_out), "demonstrated": len(shown), "shared": shared}


def read_curve(run_dir: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in records if r["kind"] == "eval"]
    train = [r for r in records if r["kind"] == "train"]
    t0 = min((r["time"] - r.get("time/eval_s", 0.0) - r.get("time/step_s", 0.0) for r in records if "time" in r),
             default=0.0)
    return {
        "eval": [{"step": r["step"], "minutes": (r["time"] - t0) / 60 if "time" in r else None,
                  "sampled_accuracy": r.get("val/reward/accuracy"),
                  "sampled_reward": r.get("val/reward/mean"),
                  "greedy_accuracy": r.get("val_greedy/reward/accuracy"),
                  "tasks_solved_best_of_attempts": r.get("val/reward/tasks_solved"), "tasks": r.get("val/reward/tasks"),
                  "roles": {k.split("/")[2]: v for k, v in r.items()
                            if k.startswith("val/role/") and k.endswith("/accuracy")},
                  "reasons": {k.removeprefix("val/reason/"): v for k, v in r.items() if k.startswith("val/reason/")},
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
    by_time = all(e.get("minutes") is not None for e in ev)
    x = [e["minutes"] if by_time else e["step"] for e in ev]
    ax.plot(x, [e["sampled_accuracy"] for e in ev], "o-", label="held-out, sampled (episode)")
    ax.plot(x, [e["greedy_accuracy"] for e in ev], "s-", label="held-out, greedy (episode)")
    rewards = [e.get("sampled_reward") for e in ev]
    if any(r is not None and r != e["sampled_accuracy"] for r, e in zip(rewards, ev, strict=True)):
        ax.plot(x, rewards, "d--", label="held-out, sampled: mean reward (F1 where graded by F1)")
    for role in sorted({r for e in ev for r in e.get("roles", {})}):
        ax.plot(x, [e.get("roles", {}).get(role) for e in ev], "^--", label=f"held-out, sampled: role {role}")
    if not by_time:
        tr = curve["train"]
        ax.plot([t["step"] for t in tr], [t["accuracy"] for t in tr], alpha=0.4, label="train batch accuracy")
    for e, xi in zip(ev, x, strict=True):
        ax.annotate(f"{e['step']}", (xi, e["sampled_accuracy"] or 0), fontsize=7, alpha=0.6)
    ax.set_xlabel("minutes (labels: step)" if by_time else "step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(curve.get("title", "learning curve"))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _preset_of(argv: list[str]) -> str | None:
    """The --preset given, read before the other defaults are set (so the preset's values become defaults)."""
    for i, arg in enumerate(argv):
        if arg == "--preset" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--preset="):
            return arg.partition("=")[2]
    return None


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
    ap.add_argument("--workflow", default=None, help="solver-judge | refinement | self-debate")
    ap.add_argument("--agent", default=None, help="your rollout, 'path/file.py:name' or 'module:name'")
    ap.add_argument("--roles", default=None, help="a LoRA adapter per role, 'solver=lora:solver,judge=lora:judge'")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="settings of one of the issue-15 curves")
    ap.add_argument("--demos", type=int, default=0, help="warm start: N reference demos → SFT → RL (docstring)")
    ap.add_argument("--demo-variants", default="direct", help="oracle variants to record, comma-separated")
    ap.add_argument("--task-variants", type=int, default=0, help="Harbor: N renamed copies of each task demonstrated")
    ap.add_argument("--sft-epochs", type=int, default=2)
    ap.add_argument("--sft-batch-size", type=int, default=8)
    ap.add_argument("--sft-lr", type=float, default=2e-5)
    ap.add_argument("extra", nargs="*", help="more `rllm train` flags, after `--`")
    if (preset := _preset_of(sys.argv[1:])) is not None:
        ap.set_defaults(**PRESETS[preset])
    args = ap.parse_args()

    out = Path(args.out)
    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # this script's own previous run: a measurement starts fresh
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    base, spent = None, 0.0
    if args.demos:
        sft_run, base, spent = warm_start(args, out)
        args.extra = [*args.extra, "--init", str(sft_run)]
    cmd = train_cmd(args, run_dir)
    print("running:", " ".join(cmd), flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # rllm sets its OpenMP spin bound itself
    proc = subprocess.run(cmd, env=env)
    curve = read_curve(run_dir)
    if base is not None:  # the base model at 0; the RL run's points after the demos and SFT minutes
        for point in curve["eval"]:
            point["minutes"] = (point["minutes"] or 0.0) + spent / 60
            point["step"] = f"rl {point['step']}"
        curve["eval"].insert(0, {**base, "minutes": 0.0, "step": "base"})
        curve["warm_start_minutes"] = spent / 60
    who = args.workflow or (Path(args.agent.partition(":")[0]).stem if args.agent else "default agent")
    curve.update({"title": f"{args.model}, {who} on {args.benchmark}, {args.algo}, {args.minutes:g} min budget",
                  "setup": vars(args), "wall_s": time.time() - started, "exit_code": proc.returncode})
    if curve["eval"]:
        first, last = curve["eval"][0], curve["eval"][-1]
        curve["sampled_gain_points"] = 100 * ((last["sampled_accuracy"] or 0) - (first["sampled_accuracy"] or 0))
        curve["greedy_gain_points"] = 100 * ((last["greedy_accuracy"] or 0) - (first["greedy_accuracy"] or 0))
        curve["sampled_reward_gain"] = (last.get("sampled_reward") or 0) - (first.get("sampled_reward") or 0)
    (out / "curve.json").write_text(json.dumps(curve, indent=2))
    plot(curve, out / "curve.png")
    print(json.dumps({k: curve.get(k) for k in ("sampled_gain_points", "greedy_gain_points", "sampled_reward_gain",
                                                 "wall_s")}))
    print(f"curve → {out / 'curve.json'} and {out / 'curve.png'}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
