"""One short real verl run on one GPU: vLLM rollouts (verl's replica behind rllm's gateway), verl's FSDP update
with rllm's advantages, verl's weight sync; prints the figures of each step. Under 10 minutes on one H100/H200.

    python benchmarks/gpu/verl_step.py                          # embedded SmolLM2-135M, arithmetic, 3 steps
    python benchmarks/gpu/verl_step.py --model /models/Qwen2.5-0.5B-Instruct --steps 2

Needs: a CUDA GPU, verl 0.9 with its vLLM extra (``pip install "rllm[verl]" "verl[vllm]>=0.9,<0.10"``) and
Ray. Without any of them it says which one is missing and exits 2 (nothing is faked). On CPU, the same backend
runs through `tests/test_verl_backend.py` instead (verl's TrainingWorker on a CPU platform).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _missing() -> list[str]:
    """What this machine lacks for a real verl GPU step."""
    problems = [f"python package {name!r}" for name in ("verl", "vllm", "ray", "torch")
                if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec("torch") is not None:
        import torch

        if not torch.cuda.is_available():
            problems.append("a CUDA GPU visible to torch")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="built-in name or a local HF model directory")
    parser.add_argument("--benchmark", default="arithmetic")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--n-gpus", type=int, default=1)
    parser.add_argument("--output", default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args()

    missing = _missing()
    if missing:
        print("verl GPU step not run: this machine lacks " + ", ".join(missing), file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from rich.console import Console

    from rllm_train.config import TrainConfig
    from rllm_train.loop import train

    out = Path(args.output or tempfile.mkdtemp(prefix="rllm-verl-gpu-"))
    config = TrainConfig(benchmark=args.benchmark, model=args.model, backend="verl", device="cuda",
                         n_gpus=args.n_gpus, batch_size=args.batch_size, group_size=args.group_size,
                         max_tokens=args.max_tokens, max_steps=args.steps, lr=1e-6, bf16=True, eval_examples=0,
                         save_every=max(args.steps, 1), output=str(out), concurrency=64)
    started = time.monotonic()
    result = train(config, progress=False, console=Console(stderr=True))
    wall = time.monotonic() - started
    keys = ("reward/mean", "time/rollout_s", "time/train_s", "time/sync_s", "time/step_s", "pack/tokens",
            "throughput/tokens_per_s", "train/loss", "train/grad_norm", "train/approx_kl", "policy_version")
    print(f"verl GPU run: {result.steps_done} steps in {wall:.1f} s (start-up included), run dir {out}")
    for m in result.history:
        print(json.dumps({k: round(m[k], 4) if isinstance(m.get(k), float) else m.get(k) for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
