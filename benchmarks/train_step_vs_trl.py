"""One GRPO step, ours vs TRL's GRPOTrainer, on the same model, prompts, group size and completion length.

Both sides: the same dtype (`--dtype`: fp32; bf16, ours training under bf16 autocast and sampling from a bf16
policy server, TRL with `bf16=True`; best, the default: bf16 where the CPU has AVX512-BF16 / AMX, else fp32 —
each at its best dtype for the CPU, the CPU flags printed), no gradient checkpointing, β = 0 (no reference
model), temperature 1, the same reward (1 when the completion contains the right sum, else 0), the same learning
rate. A step = sample G
completions for each of P prompts + one optimizer update (+ for us, pushing the weights into the policy
server). The first step of each run is a warm-up and is not timed.

Each side runs --repeats times, interleaved (ours, TRL, ours, TRL, ...) so that a machine whose speed drifts
(other jobs, thermal limits) shifts both alike; the report gives each side's median s/step and tokens/s with
their spread (min–max over the repeats) and the ratio of the medians, and splits ours into rollout / update /
weight sync.

    python benchmarks/train_step_vs_trl.py --model tiny-random --steps 3          # seconds
    python benchmarks/train_step_vs_trl.py --model smollm2-135m --steps 2         # minutes on CPU

Writes a JSON with every repeat's figures and the summary (issue 16 goal: ours ≥ 2.5× TRL per step, i.e.
TRL's median s/step ≥ 2.5 × ours).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import rllm_core.cpu_runtime  # noqa: F401  (bounds OpenMP spinning and the oneDNN cache before torch loads)
from rllm_core.cpu_features import matmul_flags, native_bf16


def make_prompts(n: int, seed: int = 0) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append((f"What is {a} + {b}? Answer with the number.", a + b))
    return out


def run_trl(args: argparse.Namespace, prompts: list[tuple[str, int]]) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rllm_serve import load_model

    loaded = load_model(args.model)
    answers = {p: str(a) for p, a in prompts}

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        out = []
        for p, c in zip(prompts, completions, strict=True):
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            question = p[-1]["content"] if isinstance(p, list) else str(p)
            out.append(1.0 if answers.get(question, "?") in text else 0.0)
        return out

    rows = [{"prompt": [{"role": "user", "content": p}]} for p, _ in prompts] * (args.steps + 1)
    n_completions = args.prompts * args.group_size
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"), per_device_train_batch_size=n_completions,
        num_generations=args.group_size, max_completion_length=args.max_tokens, learning_rate=args.lr,
        max_steps=args.steps + 1, logging_steps=1, report_to="none", use_cpu=args.device == "cpu",
        gradient_checkpointing=False, beta=0.0, temperature=1.0, save_strategy="no", bf16=args.bf16,
        shuffle_dataset=False, seed=0,
    )
    times: list[float] = []
    lengths: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t0)

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict[str, float] | None = None,
                   **k: Any) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    trainer = GRPOTrainer(model=loaded.model, reward_funcs=[reward], args=cfg,
                          train_dataset=Dataset.from_list(rows), processing_class=loaded.tokenizer,
                          callbacks=[Timer()])
    try:
        trainer.train()
    finally:
        shutil.rmtree(cfg.output_dir, ignore_errors=True)
    step_s = statistics.fmean(times[1:]) if len(times) > 1 else times[0]
    mean_len = statistics.fmean(lengths[1:]) if len(lengths) > 1 else (lengths[0] if lengths else float("nan"))
    return {"seconds_per_step": step_s, "completion_tokens_per_step": mean_len * n_completions,
            "tokens_per_s": mean_len * n_completions / step_s, "step_times": times}


def run_ours(args: argparse.Namespace, prompts: list[tuple[str, int]]) -> dict[str, Any]:
    from rllm_backends.local_torch.backend import LocalTorchBackend
    from rllm_core.rewards import RewardResult
    from rllm_core.types import Task
    from rllm_rollout.benchmarks.base import Benchmark
    from rllm_serve import load_model
    from rllm_train import TrainConfig, atrain

    class Sums(Benchmark):
        name, category, reward, splits = "sums", "bench", "contains", ("train", "test")

        def load(self, split: str = "test", data_dir: Any = None, max_examples: Any = None, seed: int = 0
                 ) -> list[Task]:
            return [self._task(i, split, p, str(a)) for i, (p, a) in enumerate(prompts)]

        def grade(self, task: Task, response: str) -> RewardResult:
            return RewardResult.correct() if task.ground_truth in response else RewardResult.fail("wrong_answer")

    out = Path(tempfile.mkdtemp(prefix="ours-"))
    config = TrainConfig(benchmark="sums", model=args.model, batch_size=args.prompts, group_size=args.group_size,
                         max_tokens=args.max_tokens, lr=args.lr, max_steps=args.steps + 1, eval_examples=0,
                         save_every=10**6, output=str(out), micro_batch_size=args.micro_batch_size,
                         temperature=1.0, device=args.device, concurrency=args.prompts * args.group_size,
                         save_episodes=False, keep_checkpoints=1, bf16=args.bf16,
                         backend_options={"server_dtype": "bfloat16" if args.bf16 else "float32"})
    backend = LocalTorchBackend(config, loaded=load_model(args.model), max_batch_size=args.prompts * args.group_size)
    try:
        result = asyncio.run(atrain(config, backend=backend, benchmark=Sums(), progress=False))
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the final checkpoint is not part of the measurement
    steps = result.history[1:] or result.history
    step_s = statistics.fmean(m["time/step_s"] for m in steps)
    tokens = statistics.fmean(m["pack/trained_tokens"] for m in steps)
    return {"seconds_per_step": step_s, "completion_tokens_per_step": tokens, "tokens_per_s": tokens / step_s,
            "phases": {k: statistics.fmean(m.get(k, 0.0) for m in steps)
                       for k in ("time/rollout_s", "time/train_s", "time/sync_s")},
            "step_times": [m["time/step_s"] for m in result.history]}


def spread(values: list[float]) -> dict[str, float]:
    """Median and range of one figure over the repeats."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {k: spread([r[k] for r in runs]) for k in ("seconds_per_step", "tokens_per_s")}
    if runs and "phases" in runs[0]:
        out["phases"] = {k: spread([r["phases"][k] for r in runs]) for k in runs[0]["phases"]}
    return out


def fmt(s: dict[str, float], unit: str, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} {unit} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (one more runs first as warm-up)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per side, interleaved ours/TRL")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="benchmarks/results/train_step_vs_trl.json")
    ap.add_argument("--dtype", choices=["best", "fp32", "bf16"], default="best",
                    help="both sides' dtype (best: bf16 where the CPU computes it natively, else fp32)")
    args = ap.parse_args()
    if args.repeats < 1 or args.steps < 1:
        ap.error("--repeats and --steps must be ≥ 1")
    args.bf16 = args.dtype == "bf16" or (args.dtype == "best" and native_bf16())
    print(f"CPU flags: {matmul_flags()} · dtype {'bf16' if args.bf16 else 'fp32'} (--dtype {args.dtype})", flush=True)
    prompts = make_prompts(args.prompts)
    ours_runs: list[dict[str, Any]] = []
    trl_runs: list[dict[str, Any]] = []
    for i in range(args.repeats):
        ours_runs.append(run_ours(args, prompts))
        print(f"[{i + 1}/{args.repeats}] ours:", json.dumps({k: v for k, v in ours_runs[-1].items()}), flush=True)
        trl_runs.append(run_trl(args, prompts))
        print(f"[{i + 1}/{args.repeats}] trl: ", json.dumps({k: v for k, v in trl_runs[-1].items()}), flush=True)
    ours, trl = summarise(ours_runs), summarise(trl_runs)
    report = {"setup": vars(args), "ours": ours, "trl": trl, "ours_runs": ours_runs, "trl_runs": trl_runs,
              "speedup_seconds_per_step": trl["seconds_per_step"]["median"] / ours["seconds_per_step"]["median"],
              "speedup_tokens_per_s": ours["tokens_per_s"]["median"] / trl["tokens_per_s"]["median"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    phases = ", ".join(f"{k.removeprefix('time/').removesuffix('_s')} {fmt(v, 's')}"
                       for k, v in ours.get("phases", {}).items())
    print(f"ours {fmt(ours['seconds_per_step'], 's/step')}, {fmt(ours['tokens_per_s'], 'tok/s', 0)} [{phases}]")
    print(f"TRL  {fmt(trl['seconds_per_step'], 's/step')}, {fmt(trl['tokens_per_s'], 'tok/s', 0)}")
    print(f"medians over {args.repeats} interleaved repeats: ours {report['speedup_seconds_per_step']:.2f}× TRL "
          f"per step (goal ≥ 2.5×), {report['speedup_tokens_per_s']:.2f}× its tokens/s → {args.out}")


if __name__ == "__main__":
    main()
