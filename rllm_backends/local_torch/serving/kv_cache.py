"""The running batch's KV cache: left-padded rows in growable buffers, plus the attention mask and positions.

Every row shares one cache length (short rows are zero-padded on the left and masked out), so a decode step
appends one column to all rows at once. HF's DynamicLayer appends with `torch.cat`, copying the whole cache
every token (~10% of a SmolLM2 step at batch 16 here); `GrowingLayer` writes into spare room instead and
only reallocates when it runs out. Rows join (`join`) and leave (`keep`) between steps; a leave drops the
columns that became padding for every remaining row, so the cache stays as long as the longest live row
however long the batch has been running. Both rebuild the layers with one copy and hand freed memory back.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["BatchCache", "GrowingLayer", "release_freed_memory"]


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None off glibc (macOS, musl) where there is nothing to call."""
    try:
        fn = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return cast(Callable[[int], int], fn)


_MALLOC_TRIM = _load_malloc_trim()


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS after the cache was rebuilt smaller (rows left / batch emptied).

    Each join/leave reallocates every layer at a new size. Once glibc has freed one such buffer its dynamic
    mmap threshold rises, so later ones come from the heap, and the freed ones stay in the process: under
    continuous arrivals RSS climbed far above the live cache (measured in docs/serving.md). A CPU tensor's
    memory is ordinary malloc memory, so `malloc_trim` returns it (a few ms per call, against ~100 ms steps).
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views into a buffer with room to append in place."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor]], length: int, spare: int = 64) -> None:
        """Stack `parts` (keys, values: rows, heads, len <= length, dim) into one new buffer, each right-aligned
        and zero-padded on the left to `length`, with `spare` columns to append into.

        Copying straight into the buffer (no `torch.cat`/index copy first) keeps a join or leave at one copy
        of the cache; the intermediates used to make each rebuild hold three copies at once.
        """
        super().__init__()
        k0, v0 = parts[0]
        self.device, self.is_initialized = k0.device, True
        rows = sum(k.shape[0] for k, _ in parts)
        self._kbuf = k0.new_empty(rows, k0.shape[1], length + spare, k0.shape[-1])
        self._vbuf = v0.new_empty(rows, v0.shape[1], length + spare, v0.shape[-1])
        r = 0
        for k, v in parts:
            n, pad = k.shape[0], length - k.shape[-2]
            self._kbuf[r: r + n, :, :pad].zero_()
            self._vbuf[r: r + n, :, :pad].zero_()
            self._kbuf[r: r + n, :, pad:length] = k
            self._vbuf[r: r + n, :, pad:length] = v
            r += n
        self._length = length
        self.keys, self.values = self._kbuf[:, :, :length], self._vbuf[:, :, :length]

    def _write(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 64) -> None:
        """Append in place; on overflow reallocate with half again as much room (a decode step's growth)."""
        q = keys.shape[-2]
        end = self._length + q
        if end > self._kbuf.shape[-2]:
            cap = end + max(spare, end // 2)
            kbuf = keys.new_empty(*keys.shape[:2], cap, keys.shape[-1])
            vbuf = values.new_empty(*values.shape[:2], cap, values.shape[-1])
            if self._length:
                kbuf[:, :, : self._length] = self._kbuf[:, :, : self._length]
                vbuf[:, :, : self._length] = self._vbuf[:, :, : self._length]
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[:, :, self._length: end] = keys
        self._vbuf[:, :, self._length: end] = values
        self._length = end
        self.keys, self.values = self._kbuf[:, :, :end], self._vbuf[:, :, :end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        self._write(key_states, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length


class BatchCache:
    """KV + attention mask (1 = real token) + next position id for each running row."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cache: DynamicCache | None = None
        self.mask_BL: torch.Tensor | None = None
        self.pos_B: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return 0 if self.pos_B is None else int(self.pos_B.shape[0])

    def join(self, kv: list[tuple[torch.Tensor, torch.Tensor]], prompt_len: int) -> None:
        """Add rows whose cache holds `prompt_len` real tokens; the shorter side is zero-padded on the left."""
        n = kv[0][0].shape[0]
        mask_nL = torch.ones(n, prompt_len, dtype=torch.long, device=self.device)
        pos_n = torch.full((n,), prompt_len, dtype=torch.long, device=self.device)
        if self.cache is None or self.mask_BL is None or self.pos_B is None:
            cache = DynamicCache()
            cache.layers = [GrowingLayer([(k, v)], prompt_len) for k, v in kv]
            self.cache, self.mask_BL, self.pos_B = cache, mask_nL, pos_n
            return
        length = max(self.mask_BL.shape[1], prompt_len)
        self._rebuild(lambda j, layer: [(layer.keys, layer.values), kv[j]], length)
        self.mask_BL = torch.cat([_left_pad(self.mask_BL, length), _left_pad(mask_nL, length)])
        self.pos_B = torch.cat([self.pos_B, pos_n])

    def keep(self, keep: list[int]) -> None:
        """Keep only these rows, and drop leading columns that became padding in every remaining row."""
        if not keep:
            self.clear()
            return
        assert self.cache is not None and self.mask_BL is not None and self.pos_B is not None
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask_BL = self.mask_BL[idx]
        first_real = int(torch.argmax((mask_BL.sum(0) > 0).to(torch.int8)))
        runs = _runs(keep)
        self._rebuild(lambda _, layer: [(layer.keys[a:b, :, first_real:], layer.values[a:b, :, first_real:])
                                        for a, b in runs], mask_BL.shape[1] - first_real)
        self.mask_BL, self.pos_B = mask_BL[:, first_real:], self.pos_B[idx]
        if self.device.type == "cpu":  # CUDA memory sits in torch's caching allocator, not malloc's heap
            release_freed_memory()

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention mask over cache + the new token, position ids) for one decode step."""
        assert self.mask_BL is not None and self.pos_B is not None
        ones = torch.ones(self.rows, 1, dtype=torch.long, device=self.device)
        return torch.cat([self.mask_BL, ones], dim=1), self.pos_B[:, None]

    def advance(self, mask_BL: torch.Tensor) -> None:
        """Record that the step ran: `mask_BL` (from step_inputs) now covers the cache, positions move on."""
        assert self.pos_B is not None
        self.mask_BL, self.pos_B = mask_BL, self.pos_B + 1

    def clear(self) -> None:
        self.cache = self.mask_BL = self.pos_B = None
        if self.device.type == "cpu":  # CUDA memory sits in torch's caching allocator, not malloc's heap
            release_freed_memory()

    def _rebuild(self, parts: Callable[[int, GrowingLayer], list[tuple[torch.Tensor, torch.Tensor]]],
                 length: int) -> None:
        """Replace each layer by `GrowingLayer(parts(j, old_layer), length)`, one layer at a time, so the old
        layer is freed before the next new one is allocated (peak: the cache plus one layer, not two caches)."""
        assert self.cache is not None
        layers = self.cache.layers
        for j in range(len(layers)):
            old = layers[j]
            assert isinstance(old, GrowingLayer)
            layers[j] = GrowingLayer(parts(j, old), length)
            del old


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Sorted row indices as [start, stop) runs of consecutive rows (few copies when most rows stay)."""
    out: list[tuple[int, int]] = []
    for r in rows:
        if out and out[-1][1] == r:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return out


def _left_pad(t: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad dim 2 (KV: batch, heads, len, dim) or dim 1 (mask: batch, len) on the left to `length`."""
    dim = 2 if t.dim() == 4 else 1
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
