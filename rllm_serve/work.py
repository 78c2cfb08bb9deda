"""What the engine schedules: a request's shared prompt, or one choice, each with its own KV block table.

A request's prompt is prefilled once (`Work` with `seq` None), then forked into its `n` choices: they share the
prompt's full blocks and each gets a private copy of the partly filled last one. A choice feeds one token per
step (its last sampled token) or, after a preemption or an abort-and-resume weight swap, its whole known text
again as a prefill. Every item feeds `tokens[table.computed:]`; when a feed reaches the end of `tokens` the
logits of its last token are sampled.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from rllm_serve.kv_pool import BlockTable, KVPool, PoolExhausted
from rllm_serve.sequence import GenerationRequest, Sequence

__all__ = ["Work", "prefix_root"]

_order = itertools.count()


def prefix_root(version: int, adapter: str | None, images: str | None = None) -> int:
    """The prefix cache's chain root: KV depends on the weights (version), on the adapter that computed it, and
    on the images behind a prompt's image tokens (the same ids stand for any image: `images` is their digest)."""
    return hash(("rllm-kv", version, adapter)) if images is None else hash(("rllm-kv", version, adapter, images))


@dataclass
class Work:
    request: GenerationRequest
    tokens: list[int]
    version: int
    seq: Sequence | None = None
    table: BlockTable = field(default_factory=BlockTable)
    order: int = field(default_factory=lambda: next(_order))

    @property
    def adapter(self) -> str | None:
        return self.request.adapter

    @property
    def root(self) -> int:
        vision = self.request.vision
        return prefix_root(self.version, self.adapter, None if vision is None else vision.digest)

    @property
    def pending(self) -> int:
        """Tokens whose KV is not computed yet (1 for a choice in plain decoding)."""
        return len(self.tokens) - self.table.computed

    @property
    def choices(self) -> int:
        """Batch slots it holds: the request's n while its prompt is prefilled, then 1 per choice."""
        return self.request.n if self.seq is None else 1

    def reuse_prefix(self, pool: KVPool) -> None:
        """Start the table from the prefix cache (all but the last token: its logits must be computed)."""
        blocks, hashes = pool.match(self.root, self.tokens, len(self.tokens) - 1)
        self.table = BlockTable(blocks, len(blocks) * pool.block_size, hashes)

    def drop_kv(self, pool: KVPool) -> None:
        """Give the KV back (a preemption or a swap to new weights); the tokens stay, to be prefilled again."""
        pool.release(self.table)
        self.table = BlockTable()

    def fork(self, pool: KVPool, seqs: list[Sequence]) -> list[Work]:
        """The prompt's choices: the first takes over this table, the others share its full blocks and copy the
        partly filled last block (their next tokens go there)."""
        out = []
        bs = pool.block_size
        full = self.table.computed // bs
        for i, seq in enumerate(seqs):
            if i == 0:
                table = self.table
            else:
                blocks = self.table.blocks[:full]
                for b in blocks:
                    pool.retain(b)
                computed = self.table.computed
                if len(self.table.blocks) > full:
                    try:
                        blocks = [*blocks, pool.copy_block(self.table.blocks[full])]
                    except PoolExhausted:  # no room for a copy: this choice computes the prompt's tail again
                        computed = full * bs
                table = BlockTable(blocks, computed, list(self.table.hashes[:full]))
            out.append(Work(self.request, list(self.tokens), self.version, seq, table, self.order))
        self.table = BlockTable()
        return out
