"""The compiled paged attention: SDPA's numbers, the same bits for a query alone, in a batch or inside a prefill,
keys and values written into their slots, and the torch path when the kernel cannot serve."""

from __future__ import annotations

import math

import pytest
import torch

from rllm_serve import attention_kernel
from rllm_serve.attention_kernel import kernel_available, kernel_plan, paged_attend

pytestmark = pytest.mark.skipif(not kernel_available(torch.float32, torch.device("cpu")),
                                reason="numba is not installed")

KVH, G, D, BS = 3, 3, 16, 8


def pool(blocks: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(blocks, KVH, BS, D, generator=gen), torch.randn(blocks, KVH, BS, D, generator=gen)


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: list[int], pos: int
              ) -> torch.Tensor:
    """SDPA of one query (H, D) over positions 0..pos of a block table."""
    k = keys[torch.tensor(table)].permute(1, 0, 2, 3).reshape(KVH, -1, D)[:, : pos + 1].repeat_interleave(G, 0)
    v = values[torch.tensor(table)].permute(1, 0, 2, 3).reshape(KVH, -1, D)[:, : pos + 1].repeat_interleave(G, 0)
    return torch.nn.functional.scaled_dot_product_attention(q[:, None], k, v)[:, 0]


def run(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: list[list[int]], seq_of: list[int],
        pos: list[int], new_k: torch.Tensor | None = None, new_v: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel on tokens whose own keys/values are already in the pool (rewritten in place unless given)."""
    slots = [tables[s][p // BS] * BS + p % BS for s, p in zip(seq_of, pos, strict=True)]
    if new_k is None:
        new_k = torch.stack([keys[s // BS, :, s % BS] for s in slots])
        new_v = torch.stack([values[s // BS, :, s % BS] for s in slots])
    return paged_attend(q, new_k, new_v, keys, values, kernel_plan(slots, pos, seq_of, tables), 1 / math.sqrt(D))


def test_the_kernel_gives_sdpa_numbers_for_decode_rows_and_prefill_tokens() -> None:
    keys, values = pool()
    gen = torch.Generator().manual_seed(1)
    tables = [[5, 9, 2, 30], [7, 1], [11, 12, 13]]
    seq_of, pos = [0, 1, 2, 2, 2], [27, 9, 0, 1, 20]
    q = torch.randn(len(pos), KVH * G, D, generator=gen)
    out = run(q, keys, values, tables, seq_of, pos)
    for t, (s, p) in enumerate(zip(seq_of, pos, strict=True)):
        assert torch.allclose(out[t], reference(q[t], keys, values, tables[s], p), atol=1e-5)


def test_a_query_is_the_same_bits_alone_in_a_batch_and_inside_a_prefill() -> None:
    keys, values = pool()
    gen = torch.Generator().manual_seed(2)
    mine = [4, 8, 15]
    length = 23
    q = torch.randn(length, KVH * G, D, generator=gen)
    prefill = run(q, keys, values, [mine], [0] * length, list(range(length)))
    for j in (0, 7, 8, 22):
        alone = run(q[j][None], keys, values, [mine], [0], [j])
        others = [[20 + i, 25 + i, 30 + i, 35 + i] for i in range(5)]
        batch = run(torch.cat([torch.randn(5, KVH * G, D, generator=gen), q[j][None]]), keys, values,
                    [*others, [*mine, 0, 0, 0]], [0, 1, 2, 3, 4, 5], [31, 3, 17, 8, 29, j])
        assert torch.equal(alone[0], batch[-1]) and torch.equal(alone[0], prefill[j])


def test_new_keys_and_values_are_written_before_anyone_attends() -> None:
    keys, values = pool()
    gen = torch.Generator().manual_seed(3)
    table = [6, 3]
    n = 11
    q = torch.randn(n, KVH * G, D, generator=gen)
    new_k, new_v = torch.randn(n, KVH, D, generator=gen), torch.randn(n, KVH, D, generator=gen)
    out = run(q, keys, values, [table], [0] * n, list(range(n)), new_k, new_v)
    for p in range(n):
        block, off = table[p // BS], p % BS
        assert torch.equal(keys[block, :, off], new_k[p]) and torch.equal(values[block, :, off], new_v[p])
    assert torch.allclose(out[n - 1], reference(q[n - 1], keys, values, table, n - 1), atol=1e-5)


def test_the_torch_path_serves_without_numba_or_for_another_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not kernel_available(torch.bfloat16, torch.device("cpu"))
    monkeypatch.setattr(attention_kernel, "_compiled", None)
    assert not kernel_available(torch.float32, torch.device("cpu"))
