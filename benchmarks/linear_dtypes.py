"""Which weight format a decode step's linear layers should use on this CPU: SmolLM2-135M's shapes at 8, 64 and 512
rows, packed oneDNN fp32 and bf16 (what the engine serves with), plain `F.linear` in both, and int8 weight-only
(`aten._weight_int8pack_mm`, the kernel torchao / gpt-fast use on CPU) with bf16 activations.

    python benchmarks/linear_dtypes.py [--threads 2] [--repeats 50]

Prints the CPU flags, then per shape and row count the median ms of each format and each one's speed relative to
packed fp32. Measured (avx2 avx512_bf16 avx512_vnni avx512f, no AMX, 2 threads): packed bf16 1.3-2.1x packed fp32
at every shape; int8 weight-only slower than packed bf16 at 14 of 15 (up to 4.6x the time: the 64-row head; 7 %
faster only for the 8-row o projection), so the engine has no int8 option on this CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rllm_core.cpu_features import matmul_flags

SHAPES = {"q|k|v": (960, 576), "o": (576, 576), "gate|up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}
"""(out, in) of SmolLM2-135M's fused and plain linear layers."""


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def formats(weight: torch.Tensor, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    def packed(dtype: torch.dtype) -> Callable[[], object]:
        w, a = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype), 64), x.to(dtype)
        return lambda: torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")

    scales = weight.abs().amax(1) / 127
    w_int8 = torch.round(weight / scales[:, None]).to(torch.int8)
    xb, wb = x.to(torch.bfloat16), weight.to(torch.bfloat16)
    return {"packed fp32": packed(torch.float32), "packed bf16": packed(torch.bfloat16),
            "F.linear fp32": lambda: F.linear(x, weight), "F.linear bf16": lambda: F.linear(xb, wb),
            "int8 weights": lambda: torch.ops.aten._weight_int8pack_mm(xb, w_int8, scales.to(torch.bfloat16))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU flags: {matmul_flags()} · torch {torch.__version__} · {args.threads} threads")
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in (8, 64, 512):
            for name, (out_f, in_f) in SHAPES.items():
                weight = torch.randn(out_f, in_f, generator=gen) * in_f ** -0.5
                x = torch.randn(rows, in_f, generator=gen)
                ms = {label: median_ms(fn, args.repeats) for label, fn in formats(weight, x).items()}
                base = ms["packed fp32"]
                shown = "  ".join(f"{label} {v:.3f} ms ({base / v:.2f}x)" for label, v in ms.items())
                print(f"{rows:>4} rows  {name:<8} {shown}", flush=True)


if __name__ == "__main__":
    main()
