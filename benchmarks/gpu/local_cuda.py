"""The local backend on one CUDA GPU, as one prepared script: the policy server's engine (exactness against a fresh
forward, alone vs batched, tokens/s on a GRPO-shaped batch) and three `rllm train` steps (policy server + trainer on
the GPU). Under 10 minutes on one H100/H200; prints one JSON line per figure and a summary table.

    python benchmarks/gpu/local_cuda.py                            # tiny-random, then the embedded SmolLM2-135M
    python benchmarks/gpu/local_cuda.py --models tiny-random --device cpu   # the same checks on the CPU (a dry run)

Without a CUDA GPU (and without `--device cpu`) it says so and exits 2: nothing is faked. On the CPU the same engine
paths are tested by tests/test_engine_paged.py (its torch path is the one CUDA runs: no numba kernel, no packed
weights) and tests/test_engine_bf16.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _fresh_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> Any:
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens], device=device)).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens, device=device)[:, None])[:, 0].cpu()


def engine_checks(model_name: str, device: str, dtype_name: str, requests: int, max_tokens: int) -> dict[str, Any]:
    """Exactness (against a fresh fp32 forward of the same weights, so a bf16 row shows its rounding; alone vs
    inside a batch) and decode tokens/s."""
    import copy

    import torch

    from rllm_serve import load_model
    from rllm_serve.engine import DecodeEngine
    from rllm_testing.engine_requests import submit

    dtype = getattr(torch, dtype_name)
    loaded = load_model(model_name, dtype=dtype, device=device)
    reference = copy.deepcopy(loaded.model).eval().float()  # the same weights computed in fp32: what rounding leaves
    engine = DecodeEngine(loaded).start()
    vocab = min(int(loaded.model.config.vocab_size), 30000)
    prompt = [(17 * i + 101) % vocab for i in range(96)]
    try:
        alone = submit(engine, prompt, 2, max_tokens=32, temperature=1.0, seed=11, ignore_eos=True)
        assert alone.done.wait(300), "the engine produced nothing in 300 s"
        noise = [submit(engine, [(p + 7 * i) % vocab for p in prompt[: 40 + 9 * i]], 2, max_tokens=48,
                         temperature=1.0) for i in range(6)]
        again = submit(engine, prompt, 2, max_tokens=32, temperature=1.0, seed=11, ignore_eos=True)
        assert again.done.wait(300) and all(j.done.wait(300) for j in noise)
        diffs = torch.cat([(_fresh_logprobs(reference, prompt, alone.tokens(c)) - torch.tensor(alone.logprobs(c)))
                           .abs() for c in range(2)])
        same_tokens = all(alone.tokens(c) == again.tokens(c) for c in range(2))
        batch_err = max(abs(a - b) for c in range(2)
                        for a, b in zip(alone.logprobs(c), again.logprobs(c), strict=False))
        # GRPO-shaped: `requests` prompts x 8 samples, temperature 1, fixed length
        rates = []
        for _ in range(3):
            started = time.monotonic()
            jobs = [submit(engine, [(p + 31 * i) % vocab for p in prompt[:64]], 8, max_tokens=max_tokens,
                            temperature=1.0, ignore_eos=True) for i in range(requests // 8)]
            assert all(j.done.wait(600) for j in jobs)
            rates.append(sum(len(j.tokens(c)) for j in jobs for c in range(8)) / (time.monotonic() - started))
    finally:
        engine.stop()
    return {"model": model_name, "device": device, "dtype": dtype_name,
            "max_abs_err_vs_fresh_forward": diffs.max().item(),
            "mean_abs_err_vs_fresh_forward": diffs.mean().item(),
            "seeded_same_tokens_alone_vs_batched": same_tokens, "max_abs_err_alone_vs_batched": batch_err,
            "grpo_tokens_per_s_median": statistics.median(rates), "grpo_requests": requests,
            "grpo_max_tokens": max_tokens}


def train_steps(model_name: str, device: str, steps: int) -> dict[str, Any]:
    """`rllm train arithmetic` on the local backend: the policy server and the trainer both on `device`."""
    from rich.console import Console

    from rllm_train.config import TrainConfig
    from rllm_train.loop import train

    out = Path(tempfile.mkdtemp(prefix="rllm-local-gpu-"))
    config = TrainConfig(benchmark="arithmetic", model=model_name, backend="local", device=device, batch_size=16,
                         group_size=4, max_tokens=32, max_steps=steps, lr=1e-6, eval_examples=0,
                         save_every=max(steps, 1), output=str(out), concurrency=64)
    started = time.monotonic()
    result = train(config, progress=False, console=Console(stderr=True))
    wall = time.monotonic() - started
    step_s = [m.get("time/step_s") for m in result.history]
    return {"model": model_name, "device": device, "steps": result.steps_done, "wall_s": wall,
            "step_s": step_s, "train_s": [m.get("time/train_s") for m in result.history],
            "tokens_per_s": [m.get("throughput/tokens_per_s") for m in result.history],
            "reward_mean": [m.get("reward/mean") for m in result.history]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-random,smollm2-135m", help="built-in names or HF directories")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--requests", type=int, default=64, help="GRPO-shaped decode load: requests in all")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="rllm train steps per model (0: skip training)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"local CUDA check not run: torch {torch.__version__} sees no CUDA GPU (use --device cpu for a "
              "dry run)", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(json.dumps({"torch": torch.__version__, "device": args.device, "name": where}))
    rows: list[dict[str, Any]] = []
    for name in [m for m in args.models.split(",") if m]:
        for dtype in [d for d in args.dtypes.split(",") if d]:
            row = engine_checks(name, args.device, dtype, args.requests, args.max_tokens)
            print(json.dumps(row), flush=True)
            rows.append(row)
        if args.steps:
            print(json.dumps(train_steps(name, args.device, args.steps)), flush=True)
    print(f"\n{'model':<16}{'dtype':<10}{'max err':>10}{'mean err':>10}{'alone=batched':>15}{'tok/s':>10}")
    for r in rows:
        print(f"{r['model']:<16}{r['dtype']:<10}{r['max_abs_err_vs_fresh_forward']:>10.1e}"
              f"{r['mean_abs_err_vs_fresh_forward']:>10.1e}"
              f"{r['seeded_same_tokens_alone_vs_batched']!s:>15}{r['grpo_tokens_per_s_median']:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
