"""The engine's KV cache: fixed-size blocks in one preallocated pool, shared by reference, with a prefix cache.

Every sequence owns a block table (block ids, in order); its token at position p lives in block
``table[p // block_size]`` at offset ``p % block_size``. Rows join and leave by taking and returning blocks: no
other row's cache is copied, ever (the old engine rebuilt the whole left-padded cache, all layers, on every join
and leave). A full block can be shared: the n samples of a prompt point at the prompt's blocks, and a block whose
tokens are known is kept in a prefix cache (keyed by the hash chain of every token before it, the policy version
and the adapter), so a multi-turn agent's next call, whose prompt starts with the whole previous conversation,
finds that conversation's KV already computed. Blocks nobody references stay cached until the pool runs short;
then the least recently used are evicted (vLLM's automatic prefix caching, at block granularity).

Pool layout per layer: keys and values of shape (blocks, kv_heads, block_size, head_dim), so gathering a row's
blocks yields its keys chunked by block, which is what the attention (paged_attention.py) reduces over.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["BLOCK_SIZE", "BlockTable", "KVPool", "PoolExhausted", "pool_shape"]

BLOCK_SIZE = 32
"""Tokens per block: the prefix cache's granularity and the attention's chunk length."""


class PoolExhausted(RuntimeError):
    """No free or evictable block is left: the caller waits for rows to finish (or preempts one)."""


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor whose pages are committed only when written, on the CPU: numpy's zeros is calloc, which
    maps zero pages lazily, where torch.zeros writes every byte. A 1 GB pool then costs the memory of the
    blocks in use, not 1 GB from the start."""
    if device.type == "cpu" and dtype in (torch.float32, torch.float16, torch.float64):
        return torch.from_numpy(np.zeros(shape, dtype=torch.empty((), dtype=dtype).numpy().dtype))
    return torch.zeros(shape, dtype=dtype, device=device)


def pool_shape(model_config: object) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers decoder config (a vision-language model's text config)."""
    get_text = getattr(model_config, "get_text_config", None)
    cfg = get_text() if callable(get_text) else model_config
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads)
    return layers, kv_heads, head_dim


@dataclass
class BlockTable:
    """One sequence's blocks and how many of its positions hold computed KV."""

    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    hashes: list[int] = field(default_factory=list)
    """Prefix-cache key of each full block, in order (the chain continues from the last one)."""

    def slot(self, position: int, block_size: int = BLOCK_SIZE) -> int:
        return self.blocks[position // block_size] * block_size + position % block_size


class KVPool:
    """Preallocated KV blocks for every layer, reference counts, and the prefix cache over full blocks."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_blocks: int, dtype: torch.dtype,
                 device: torch.device, block_size: int = BLOCK_SIZE) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV pool needs at least 2 blocks, got {num_blocks}")
        self.block_size, self.num_blocks = block_size, num_blocks
        shape = (num_blocks, kv_heads, block_size, head_dim)
        # block 0 stays zero: padding entries of a block table point at it
        self.keys = [_zeros(shape, dtype, device) for _ in range(layers)]
        self.values = [_zeros(shape, dtype, device) for _ in range(layers)]
        self._free: list[int] = list(range(num_blocks - 1, 0, -1))
        self._refs = [0] * num_blocks
        self._cached: dict[int, int] = {}
        """prefix hash -> block holding exactly those tokens"""
        self._hash_of: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        """cached blocks no sequence references, least recently used first"""
        self.hits = 0
        self.evictions = 0

    @staticmethod
    def bytes_per_block(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                        block_size: int = BLOCK_SIZE) -> int:
        return 2 * layers * kv_heads * block_size * head_dim * torch.empty((), dtype=dtype).element_size()

    # ------------------------------------------------------------------ blocks
    @property
    def free_blocks(self) -> int:
        """Blocks that can be handed out now (free, or cached and evictable)."""
        return len(self._free) + len(self._evictable)

    def allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._hash_of.pop(block)]
            self.evictions += 1
        else:
            raise PoolExhausted("every KV block is in use")
        self._refs[block] = 1
        return block

    def retain(self, block: int) -> None:
        if self._refs[block] == 0:
            self._evictable.pop(block, None)
        self._refs[block] += 1

    def release(self, table: BlockTable) -> None:
        """Drop a finished sequence's references; cached blocks stay (evictable), the rest become free."""
        for block in table.blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        table.blocks, table.computed, table.hashes = [], 0, []

    def ensure(self, table: BlockTable, length: int) -> None:
        """Give `table` enough blocks for `length` positions."""
        need = -(-length // self.block_size) - len(table.blocks)
        if need > self.free_blocks:
            raise PoolExhausted(f"{need} KV blocks needed, {self.free_blocks} free")
        for _ in range(need):
            table.blocks.append(self.allocate())

    def copy_block(self, src: int) -> int:
        """A private copy of block `src` (the partly filled last block of a prompt its samples share)."""
        dst = self.allocate()
        for k, v in zip(self.keys, self.values, strict=True):
            k[dst].copy_(k[src])
            v[dst].copy_(v[src])
        return dst

    # ------------------------------------------------------------------ prefix cache
    @staticmethod
    def chain(parent: int, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    def match(self, root: int, tokens: list[int], limit: int) -> tuple[list[int], list[int]]:
        """The cached blocks holding the longest full-block prefix of `tokens` (at most `limit` tokens), retained
        for the caller, and their hashes."""
        blocks: list[int] = []
        hashes: list[int] = []
        parent = root
        bs = self.block_size
        for i in range(limit // bs):
            h = self.chain(parent, tuple(tokens[i * bs:(i + 1) * bs]))
            block = self._cached.get(h)
            if block is None:
                break
            self.retain(block)
            self._evictable.pop(block, None)
            blocks.append(block)
            hashes.append(h)
            parent = h
        self.hits += len(blocks)
        return blocks, hashes

    def register(self, table: BlockTable, root: int, tokens: list[int]) -> None:
        """Enter the table's newly completed full blocks (their KV computed) into the prefix cache."""
        bs = self.block_size
        full = min(table.computed, len(tokens)) // bs
        while len(table.hashes) < full:
            i = len(table.hashes)
            parent = table.hashes[-1] if table.hashes else root
            h = self.chain(parent, tuple(tokens[i * bs:(i + 1) * bs]))
            table.hashes.append(h)
            block = table.blocks[i]
            if h not in self._cached and block not in self._hash_of:
                self._cached[h], self._hash_of[block] = block, h

    def clear_cache(self) -> None:
        """Forget every cached prefix (new weights make their KV stale); blocks in use stay with their rows."""
        for block in self._evictable:
            self._free.append(block)
        self._evictable.clear()
        self._cached.clear()
        self._hash_of.clear()

    def drop_pages(self) -> int:
        """Return the pool's committed pages to the OS while no block is in use (whole pages read as zeros again;
        block 0, the padding block, stays zero): the largest batch's memory is not held through an update."""
        from rllm_serve.heap import drop_pages

        if any(self._refs):
            return 0
        self.clear_cache()
        return sum(drop_pages(t) for t in (*self.keys, *self.values))

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)
