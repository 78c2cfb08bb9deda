"""Batch-invariant linear layers: a row's product has the same bits whatever else is in the batch (CPU).

CPU matmuls compute rows in blocks of GEMM_ROW_BLOCK and the 1-3 rows left over with other kernels (measured
here: a row's product has the same bits in every full block, at any row count and position, and other bits in
a remainder). While a seeded request is in a forward pass, every linear layer is fed a multiple of that many
rows (zero rows appended, dropped after). Together with the blocked attention (paged_attention.py) this makes a
seeded request sample the same tokens with the same logprobs however concurrent requests are batched.

A wide layer (the 49k-vocabulary LM head) is computed transposed, weight slab by weight slab: `F.linear` on it
runs at a third of this CPU's matmul rate (it streams the 113 MB weight once per 4-row block), the slabbed form
is 1.6-2x faster at 8-128 rows and gives the same bits as `F.linear` from WIDE_MIN_ROWS rows on, at any count
(measured; fewer rows are padded up to that).
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from rllm_serve.gemm_rows import WIDE_MIN_ROWS, WIDE_SLAB  # checked there with the row block, at start
from rllm_serve.paged_attention import GEMM_ROW_BLOCK

__all__ = ["WIDE_MIN_ROWS", "WIDE_OUT_FEATURES", "batch_invariant", "make_batch_invariant", "wide_linear"]

WIDE_OUT_FEATURES = 8192  # layers at least this wide take the slabbed path (in practice: the LM head)

_invariant = threading.local()


@contextlib.contextmanager
def batch_invariant(on: bool) -> Iterator[None]:
    """Run the forward passes inside with (or without) padded linear layers."""
    before = getattr(_invariant, "on", False)
    _invariant.on = on
    try:
        yield
    finally:
        _invariant.on = before


def wide_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x @ weight.T` for a 2-D `x` of at least WIDE_MIN_ROWS rows, one weight slab at a time (no autograd)."""
    rows, out_features = x.shape[0], weight.shape[0]
    out = x.new_empty(rows, out_features)
    xt = x.t()
    slab = x.new_empty(WIDE_SLAB, rows)
    for start in range(0, out_features, WIDE_SLAB):
        w = weight[start: start + WIDE_SLAB]
        part = slab[: w.shape[0]]
        torch.mm(w, xt, out=part)
        out[:, start: start + w.shape[0]].copy_(part.t())
    return out


def _padded_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`F.linear` on rows zero-padded to a multiple of GEMM_ROW_BLOCK (padding dropped), except for a lone row
    outside a batch-invariant pass (a matrix-vector product, twice as fast as a padded 4-row matmul).

    Padding every multi-row pass, seeded or not, makes a prompt's KV the same bits however its prefill was split
    (by the prefix cache or the step's token budget), so even an unseeded greedy request repeats exactly.
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    lone = rows == 1 and not getattr(_invariant, "on", False)
    wide = self.out_features >= WIDE_OUT_FEATURES and rows > 0 and not lone and not torch.is_grad_enabled()
    extra = max(0, WIDE_MIN_ROWS - rows) if wide else -rows % GEMM_ROW_BLOCK
    if not wide and (not extra or lone):
        return F.linear(x, self.weight, self.bias)
    flat = x.reshape(rows, x.shape[-1])
    if extra:
        flat = torch.cat([flat, flat.new_zeros(extra, flat.shape[-1])])
    if not wide:
        return F.linear(flat, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], -1)
    out = wide_linear(flat, self.weight)[:rows]
    if self.bias is not None:
        out += self.bias
    return out.reshape(*x.shape[:-1], -1)


def make_batch_invariant(model: torch.nn.Module) -> bool:
    """Patch every plain nn.Linear of `model` to pad its rows inside `batch_invariant(True)` (a no-op outside).

    The price: up to 3 padded rows per matmul, which for a lone row is a 4-row matmul instead of a
    matrix-vector product. GPUs are not covered: their kernels vary with shape in ways this cannot pin down.
    """
    patched = False
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = types.MethodType(_padded_linear, module)  # type: ignore[method-assign]
            patched = True
    return patched
