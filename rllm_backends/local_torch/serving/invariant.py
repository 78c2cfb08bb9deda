"""Batch-invariant linear layers: a row's product has the same bits whatever else is in the batch (CPU).

CPU matmuls compute rows in blocks of GEMM_ROW_BLOCK and the 1-3 rows left over with other kernels (measured
here: a row's product has the same bits in every full block, at any row count and position, and other bits in
a remainder). While a seeded request is in a forward pass, every linear layer is fed a multiple of that many
rows (zero rows appended, dropped after). Together with the blocked attention (paged_attention.py) this makes a
seeded request sample the same tokens with the same logprobs however concurrent requests are batched.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from rllm_backends.local_torch.serving.paged_attention import GEMM_ROW_BLOCK

__all__ = ["batch_invariant", "make_batch_invariant"]

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


def _padded_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`F.linear` on rows zero-padded to a multiple of GEMM_ROW_BLOCK (padding dropped), except for a lone row
    outside a batch-invariant pass (a matrix-vector product, twice as fast as a padded 4-row matmul).

    Padding every multi-row pass, seeded or not, makes a prompt's KV the same bits however its prefill was split
    (by the prefix cache or the step's token budget), so even an unseeded greedy request repeats exactly.
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    extra = -rows % GEMM_ROW_BLOCK
    if not extra or (rows == 1 and not getattr(_invariant, "on", False)):
        return F.linear(x, self.weight, self.bias)
    flat = x.reshape(rows, x.shape[-1])
    padded = torch.cat([flat, flat.new_zeros(extra, flat.shape[-1])])
    return F.linear(padded, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], -1)


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
