"""The local backend hands freed heap pages back to the OS after an update (glibc's malloc_trim)."""

from __future__ import annotations

import ctypes.util

import psutil
import pytest

from rllm_backends.local_torch.heap import release_free_memory


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
