"""The local backend hands freed heap pages back to the OS after an update (glibc's malloc_trim)."""

from __future__ import annotations

import ctypes.util

import psutil
import pytest

from rllm_serve.heap import release_free_memory


@pytest.mark.skipif(not ctypes.util.find_library("c"), reason="no C library to trim on this platform")
def test_freed_holes_in_the_heap_go_back_to_the_os() -> None:
    """Chunks freed between chunks still alive (the fragmentation an update leaves) stay in the process until
    trimmed: glibc only gives back the heap's free top by itself."""
    me = psutil.Process()
    chunks = [bytearray(64 * 1024) for _ in range(4000)]  # ~256 MiB from the heap (under the mmap threshold)
    for c in chunks:
        c[::4096] = b"x" * len(c[::4096])  # touch every page
    kept = chunks[::16]
    del chunks
    before = me.memory_info().rss
    release_free_memory()
    after = me.memory_info().rss
    assert before - after > 100 * 2**20, (before, after)
    assert len(kept) == 250


def test_an_idle_kv_pool_gives_its_pages_back_and_reads_as_zeros() -> None:
    import torch

    from rllm_serve.kv_pool import BlockTable, KVPool

    pool = KVPool(layers=2, kv_heads=2, head_dim=64, num_blocks=256, dtype=torch.float32, device=torch.device("cpu"))
    table = BlockTable()
    pool.ensure(table, 16 * 200)
    for t in (*pool.keys, *pool.values):
        t[1:].fill_(1.5)
    assert pool.drop_pages() == 0 and float(pool.keys[0][5].sum()) > 0  # a block in use: nothing dropped
    pool.release(table)
    dropped = pool.drop_pages()
    assert dropped >= 0.9 * sum(t.numel() * 4 for t in (*pool.keys, *pool.values))
    for t in (*pool.keys, *pool.values):  # whole pages read as zeros again (a partial page at an end keeps its
        assert float(t[0].abs().sum()) == 0.0 and float(t[1:-1].abs().sum()) == 0.0  # bytes; block 0 stays 0)
    assert pool.free_blocks == 255 and pool.cached_blocks == 0
