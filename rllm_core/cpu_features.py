"""What this CPU computes natively, read once from /proc/cpuinfo.

Machines of this project differ (AVX2 only; AVX512-BF16; AMX), and what is fastest differs with them: bf16 matmuls
run in hardware on AVX512-BF16 / AMX (oneDNN's packed bf16 linear is ~1.8x its fp32 one at decode shapes on an
AVX512-BF16 CPU) and fall back to a slow kernel without them. Defaults that depend on it (the engine's dtype, the
arithmetic benchmark's bf16 autocast) ask `native_bf16`; benchmarks print `matmul_flags` beside every figure.
"""

from __future__ import annotations

import functools

__all__ = ["cpu_flags", "matmul_flags", "native_bf16"]

_MATMUL_PREFIXES = ("amx", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx512f", "avx2")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere, so nothing is assumed)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def native_bf16() -> bool:
    """True when the CPU has bf16 matmul instructions (AVX512-BF16 or AMX-BF16)."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def matmul_flags() -> str:
    """The matmul-relevant flags, for printing beside a figure ("unknown" where they cannot be read)."""
    if not cpu_flags():
        return "unknown"
    keep = sorted(f for f in cpu_flags() if f.startswith(_MATMUL_PREFIXES))
    return " ".join(keep) or "none of avx2/avx512/amx"
