"""Give freed heap memory back to the operating system after the big transient phases of a step.

An update allocates and frees gigabytes (activations, gradients, the log-softmax chunks) and a weight sync
streams a model's worth of tensors. glibc keeps what was freed in its arenas for reuse, so a process's RSS
climbs step after step to the largest mix of sizes it ever held: the README's main job grew from 4.9 to 5.7
GiB over 60 steps. `malloc_trim(0)` returns the free pages of every arena at once (a few milliseconds here),
which keeps RSS flat at what the step really holds. Elsewhere (musl, macOS, Windows) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

__all__ = ["drop_pages", "release_free_memory"]

log = logging.getLogger("rllm.local_torch")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> object | None:
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> None:
    """Return the C heap's free pages to the OS (glibc); a no-op where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)  # type: ignore[operator]


_MADV_DONTNEED = 4
_PAGE = 4096


@functools.cache
def _madvise() -> object | None:
    fn = getattr(_libc(), "madvise", None)
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def drop_pages(tensor: object) -> int:
    """Give the whole pages of a CPU tensor's memory back to the OS, which reads as zeros afterwards: for a
    preallocated buffer none of whose contents is needed any more (an idle KV pool), whose pages the next
    writes commit again. Returns the bytes dropped (0 where madvise is missing or the tensor is not on CPU)."""
    import torch

    fn = _madvise()
    if fn is None or not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or \
            not tensor.is_contiguous():
        return 0
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    first, last = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE  # whole pages only: neighbours are untouched
    if last <= first or fn(first, last - first, _MADV_DONTNEED) != 0:  # type: ignore[operator]
        return 0
    return last - first
