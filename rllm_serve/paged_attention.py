"""Attention over the block pool for a packed step: decode rows and prefill segments in one forward pass.

The engine feeds the model every new token of a step as its own batch row (input shape (tokens, 1)), so linear
layers see one flat matrix, peft can name an adapter per token, and there is no padding. This attention
implementation (registered with transformers as ``rllm_paged``) writes each token's key and value into its slot
of the pool and attends each query over its own sequence's blocks, read in place by block id.

The computation is blocked the same way for every query: scores against one block at a time (a GEMM whose row
count is padded to a multiple of GEMM_ROW_BLOCK), a per-block max and sum, then the blocks combined by a pairwise
tree over a power-of-two number of blocks (empty ones add exact zeros). So a query's output is the same bits
whether it is computed in a decode step beside 63 other rows, alone, or as one token of a long prefill, and
whatever the block table's padding: the KV at every position is a function of the tokens before it only. That
is what lets a seeded request reproduce bit for bit while prefix caching decides, by timing, which of its prompt
positions were computed by whom.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rllm_serve.attention_kernel import KernelPlan, paged_attend
from rllm_serve.gemm_rows import GEMM_ROW_BLOCK  # measured on this CPU (4 rows on AVX2 / AVX512 machines)

__all__ = ["GEMM_ROW_BLOCK", "PAGED_ATTENTION", "Segment", "StepPlan", "attend", "current_plan", "plan_scope",
           "pow2_width", "visible_keys"]

PAGED_ATTENTION = "rllm_paged"
QUERY_CHUNK = 256
"""Prefill queries attended per call (bounds the score tensor; a multiple of every row block gemm_rows may measure,
so chunking changes no bits)."""


@dataclass
class Segment:
    """Consecutive packed tokens of one sequence: rows [start, start + n) at positions [pos0, pos0 + n)."""

    start: int
    n: int
    pos0: int
    blocks: list[int]


@dataclass
class StepPlan:
    """What the attention of one forward pass needs: where each new token's KV goes and whom it attends."""

    slots: torch.Tensor
    """(tokens,) flat pool slot of each packed token: block * block_size + offset."""
    decode_rows: torch.Tensor
    """(R,) packed indices of single-token segments, attended together."""
    decode_tables: torch.Tensor
    """(R, blocks) their block tables, padded with block 0."""
    decode_pos: torch.Tensor
    """(R,) their positions."""
    decode_visible: torch.Tensor | None
    prefills: list[Segment]
    pool_keys: list[torch.Tensor]
    pool_values: list[torch.Tensor]
    block_size: int
    logit_rows: torch.Tensor | None = None
    """Packed rows the LM head runs on (the last token of each feed that is sampled)."""
    kernel: KernelPlan | None = None
    """Set when the compiled kernel (attention_kernel.py) computes this step's attention."""


_local = threading.local()


def current_plan() -> StepPlan | None:
    return getattr(_local, "plan", None)


class plan_scope:
    """Install a StepPlan for the forward passes run inside (engine thread only)."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan

    def __enter__(self) -> StepPlan:
        self.before = current_plan()
        _local.plan = self.plan
        return self.plan

    def __exit__(self, *exc: object) -> None:
        _local.plan = self.before


def _pad_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    extra = -x.shape[dim] % GEMM_ROW_BLOCK
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim)


def pow2_width(blocks: int) -> int:
    """Block-table width of a pass: a power of two, so the pairwise tree over blocks is always full (padding
    entries point at block 0, all zeros, beyond every query's position: they add exact zeros)."""
    return 1 << max(0, blocks - 1).bit_length()


def visible_keys(tables: torch.Tensor, qpos: torch.Tensor, block_size: int) -> torch.Tensor:
    """(R, blocks, 1, m, bs) mask: key positions at or before each query row's position."""
    nb = tables.shape[1]
    kpos = torch.arange(nb * block_size, device=tables.device).view(nb, block_size)
    return kpos[None, :, None, None, :] <= qpos[:, None, None, :, None]


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: torch.Tensor, qpos: torch.Tensor,
           scale: float, block_size: int, visible: torch.Tensor | None = None) -> torch.Tensor:
    """Blocked attention of query rows over their block tables.

    q: (R, kv_heads, m, D), m query rows per KV head (GQA groups x tokens); tables: (R, blocks) block ids, padded
    with block 0; qpos: (R, m) each query row's position (keys at positions <= it are visible); `visible`: the
    mask `visible_keys` gives (passed in when every layer of a pass shares it). Returns (R, kv_heads, m, D).
    """
    R, _, m, _ = q.shape
    dtype = q.dtype
    q = q.to(keys.dtype)  # a half-precision model's queries over its fp32 pool (attention_kernel.kv_dtype)
    width = pow2_width(tables.shape[1])
    if width > tables.shape[1]:
        tables = torch.cat([tables, tables.new_zeros(R, width - tables.shape[1])], 1)
        visible = None
    if visible is None:
        visible = visible_keys(tables, qpos, block_size)
    k = keys[tables]  # R, nb, kv_heads, bs, D
    v = values[tables]
    s = torch.matmul(_pad_rows(q, 2)[:, None], k.transpose(-1, -2))[:, :, :, :m] * scale  # R, nb, kvh, m, bs
    s = s.masked_fill(~visible, float("-inf"))
    m_c = s.amax(-1)
    m_safe = torch.where(torch.isinf(m_c), torch.zeros_like(m_c), m_c)
    p = torch.exp(s - m_safe[..., None])
    sum_c = p.sum(-1)
    out_c = torch.matmul(_pad_rows(p, 3), v)[:, :, :, :m]  # R, nb, kvh, m, D
    w = torch.exp(m_c - m_c.amax(1, keepdim=True))
    num, den = out_c * w[..., None], sum_c * w
    while num.shape[1] > 1:
        num, den = num[:, 0::2] + num[:, 1::2], den[:, 0::2] + den[:, 1::2]
    return (num[:, 0] / den[:, 0, ..., None]).to(dtype)


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention interface: query (T, H, 1, D), key/value (T, kv_heads, 1, D) -> (T, 1, H, D)."""
    plan = current_plan()
    if plan is None:  # the served model called directly (a test's reference pass): plain SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    layer = int(module.layer_idx)
    kp, vp = plan.pool_keys[layer], plan.pool_values[layer]
    T, H, _, D = query.shape
    scale = scaling if scaling is not None else 1.0 / math.sqrt(D)
    if plan.kernel is not None:
        out = paged_attend(query[:, :, 0].contiguous(), key[:, :, 0].contiguous(), value[:, :, 0].contiguous(), kp,
                           vp, plan.kernel, scale)
        return out.view(T, 1, H, D), None
    kvh = key.shape[1]
    g = H // kvh
    bs = plan.block_size
    blocks_idx, offs = plan.slots // bs, plan.slots % bs  # pool layout (blocks, kvh, bs, D)
    kp[blocks_idx, :, offs] = key[:, :, 0].to(kp.dtype)
    vp[blocks_idx, :, offs] = value[:, :, 0].to(vp.dtype)
    q = query[:, :, 0].view(T, kvh, g, D)
    out = query.new_empty(T, kvh, g, D)
    if plan.decode_rows.numel():
        rows = plan.decode_rows
        qpos = plan.decode_pos[:, None].expand(-1, g)
        out[rows] = attend(q[rows], kp, vp, plan.decode_tables, qpos, scale, bs, plan.decode_visible)
    for seg in plan.prefills:
        for a in range(0, seg.n, QUERY_CHUNK):
            b = min(seg.n, a + QUERY_CHUNK)
            last = seg.pos0 + b - 1
            table = torch.tensor(seg.blocks[: last // bs + 1], dtype=torch.long, device=query.device)
            qs = q[seg.start + a: seg.start + b].permute(1, 0, 2, 3).reshape(1, kvh, (b - a) * g, D)
            qpos = torch.arange(seg.pos0 + a, seg.pos0 + b, device=query.device).repeat_interleave(g)[None]
            o = attend(qs, kp, vp, table[None], qpos, scale, bs)  # 1, kvh, n*g, D
            out[seg.start + a: seg.start + b] = o[0].view(kvh, b - a, g, D).permute(1, 0, 2, 3)
    return out.view(T, 1, H, D), None


def _mask(*args: Any, **kwargs: Any) -> Any:
    """Masks are the block tables' business inside an engine step (none is built); SDPA's mask outside."""
    return None if current_plan() is not None else sdpa_mask(*args, **kwargs)


AttentionInterface.register(PAGED_ATTENTION, paged_attention)
AttentionMaskInterface.register(PAGED_ATTENTION, _mask)
