"""The running batch's KV cache: left-padded rows in growable buffers, plus the attention mask and positions.

Every row shares one cache length (short rows are zero-padded on the left and masked out), so a decode step
appends one column to all rows at once. HF's DynamicLayer appends with `torch.cat`, copying the whole cache
every token (~10% of a SmolLM2 step at batch 16 here); `GrowingLayer` writes into spare room instead and
only reallocates when it runs out. Rows join (`join`) and leave (`keep`) between steps.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["BatchCache", "GrowingLayer"]


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views into a buffer with room to append in place."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 64) -> None:
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self._length = 0
        self._kbuf = keys.new_empty(0)
        self._vbuf = values.new_empty(0)
        self._write(keys, values, spare)

    def _write(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 64) -> None:
        q = keys.shape[-2]
        end = self._length + q
        if self._kbuf.dim() != 4 or end > self._kbuf.shape[-2]:
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
            merged, self.mask_BL, self.pos_B = kv, mask_nL, pos_n
        else:
            length = max(self.mask_BL.shape[1], prompt_len)
            merged = [(torch.cat([_left_pad(layer.keys, length), _left_pad(k, length)]),
                       torch.cat([_left_pad(layer.values, length), _left_pad(v, length)]))
                      for layer, (k, v) in zip(self.cache.layers, kv, strict=True)]
            self.mask_BL = torch.cat([_left_pad(self.mask_BL, length), _left_pad(mask_nL, length)])
            self.pos_B = torch.cat([self.pos_B, pos_n])
        self._set_layers(merged)

    def keep(self, keep: list[int]) -> None:
        """Keep only these rows, and drop leading columns that became padding in every remaining row."""
        if not keep:
            self.clear()
            return
        assert self.cache is not None and self.mask_BL is not None and self.pos_B is not None
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask_BL = self.mask_BL[idx]
        first_real = int(torch.argmax((mask_BL.sum(0) > 0).to(torch.int8)))
        self._set_layers([(layer.keys[idx, :, first_real:], layer.values[idx, :, first_real:])
                          for layer in self.cache.layers])
        self.mask_BL, self.pos_B = mask_BL[:, first_real:], self.pos_B[idx]

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

    def _set_layers(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        cache = DynamicCache()
        cache.layers = [GrowingLayer(k, v) for k, v in kv]
        self.cache = cache


def _left_pad(t: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad dim 2 (KV: batch, heads, len, dim) or dim 1 (mask: batch, len) on the left to `length`."""
    dim = 2 if t.dim() == 4 else 1
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
