"""How this CPU's matmul library splits a product's rows, measured once: the padding that keeps a row's bits.

A CPU GEMM computes its rows in blocks and the rows left over with other kernels, which give other bits; so a
row's product depends on how many rows share the call unless every call is fed a multiple of the block. The
block is the library's choice for the CPU it runs on: 4 rows on the AVX2 and AVX512-BF16 CPUs this engine was
built on, and not necessarily that on another (an AMX machine's fp32 kernels differ: a seeded request alone and
batched came out 2e-6 apart there with a fixed 4). So it is measured, not assumed: the smallest of
`CANDIDATES` at which a row's product has the same bits at every multiple of it, at any place in the call, for
the shapes the engine multiplies (linear layers and the attention's per-block score and value products).

Where no candidate gives that, the engine pads to the largest and says so (`BATCH_INVARIANT` False): a request's
logprobs then agree alone and batched to ~1e-5 (float32 rounding), not to the bit, and the docs state that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["BATCH_INVARIANT", "CANDIDATES", "GEMM_ROW_BLOCK", "WIDE_MIN_ROWS", "WIDE_SLAB", "measure_row_block"]

log = logging.getLogger("rllm.serving.gemm")

CANDIDATES = (4, 8, 16, 32)
_LINEAR_SHAPES = ((64, 64), (576, 192), (1536, 576))  # (in, out): tiny-random's and SmolLM2's kinds of layer
_ATTENTION_SHAPES = ((16, 16), (64, 32))  # (head dim, block size): scores q·Kᵀ and the weighted values p·V
WIDE_SLAB = 1024
"""Weight rows per slab of the LM head's product (invariant.wide_linear): its (slab, rows) product stays in cache."""
WIDE_MIN_ROWS = 12
"""From this many rows on the slabbed product's bits do not depend on the row count (checked by `_wide_invariant`)."""


def _same_bits_at_multiples(block: int, product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> bool:
    """Whether `product`'s row r (rows are x's dim 0) has the same bits when the call holds 1, 2, 3 or 5 blocks of
    rows, starting at row 0 or one block in, as in one call over all of x."""
    full = product(x)
    for rows in (block, 2 * block, 3 * block, 5 * block):
        for offset in (0, block):
            part = x[offset: offset + rows]
            if offset + rows <= x.shape[0] and not torch.equal(product(part), full[offset: offset + rows]):
                return False
    return True


def _batched(other: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x (rows, batch, k) -> (rows, batch, n): one matmul per batch entry against other (batch, k, n)."""
    return lambda x: torch.matmul(x.transpose(0, 1), other).transpose(0, 1)


def _invariant_at(block: int, gen: torch.Generator) -> bool:
    rows = 8 * block
    for in_features, out_features in _LINEAR_SHAPES:
        weight = torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5
        x = torch.randn(rows, in_features, generator=gen)
        if not _same_bits_at_multiples(block, lambda v, w=weight: F.linear(v, w), x):
            return False
    for dim, block_size in _ATTENTION_SHAPES:  # scores q·Kᵀ, then the weighted values p·V, per (row, block)
        keys = torch.randn(3, block_size, dim, generator=gen)
        queries = torch.randn(rows, 3, dim, generator=gen)
        probs = torch.rand(rows, 3, block_size, generator=gen)
        if not (_same_bits_at_multiples(block, _batched(keys.transpose(-1, -2)), queries)
                and _same_bits_at_multiples(block, _batched(keys), probs)):
            return False
    return True


def _wide_invariant(gen: torch.Generator) -> bool:
    """The LM head's slabbed product (invariant.wide_linear: a weight slab times the rows transposed, so the rows
    are the GEMM's columns) has the same bits from WIDE_MIN_ROWS rows on."""
    weight = torch.randn(WIDE_SLAB, 576, generator=gen)
    x = torch.randn(80, 576, generator=gen)
    full = torch.mm(weight, x.t()).t()
    counts = (WIDE_MIN_ROWS, WIDE_MIN_ROWS + 1, 16, 17, 31, 64)
    return all(torch.equal(torch.mm(weight, x[offset: offset + rows].t()).t(), full[offset: offset + rows])
               for rows in counts for offset in (0, 5))


def measure_row_block() -> tuple[int, bool]:
    """(the row block to pad to, whether products are batch-invariant here with it); a few ms, once a process."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        wide = _wide_invariant(gen)
        block = next((b for b in CANDIDATES if _invariant_at(b, gen)), None)
    if block is not None and wide:
        return block, True
    log.warning("this CPU's matmuls do not keep a row's bits at every batch size (row blocks %s: %s; the LM head's "
                "slabs: %s): batched requests agree with lone ones to ~1e-5, not to the bit", CANDIDATES,
                "none" if block is None else block, "invariant" if wide else "not invariant")
    return block or CANDIDATES[-1], False


GEMM_ROW_BLOCK, BATCH_INVARIANT = measure_row_block()
"""Every matmul whose row count varies with the batch is fed a multiple of GEMM_ROW_BLOCK rows."""
