"""The engine's scheduler: which work runs in the next step, and what happens to work that cannot.

It admits waiting requests while batch slots and KV blocks allow, plans each step (every decoding choice, then
prefills within the step's token budget: chunked prefill), reserves the KV blocks a step needs from the block
manager (kv_pool.py), preempting the youngest choices when the pool runs out (their KV is dropped; they prefill
their text again later), and retires finished or failed work. It never runs the model: the engine hands the
plan to the model runner (model_runner.py).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from rllm_serve.kv_pool import KVPool, PoolExhausted
from rllm_serve.sequence import GenerationRequest
from rllm_serve.work import Work

__all__ = ["POOL_TOO_SMALL", "Scheduler"]

log = logging.getLogger("rllm.serving.engine")

POOL_TOO_SMALL = ("the KV cache is too small for this request: start the server with a larger kv_cache_gb, "
                  "or send a shorter prompt")


class Scheduler:
    """The batch (`work`) and its plan per step. `end_request(req, reason, error)` ends a request that holds no
    work (the engine emits its events); `on_retire(work)` is told when work leaves the batch."""

    def __init__(self, pool: KVPool, max_batch_size: int, max_step_tokens: int, vocab: int,
                 end_request: Callable[[GenerationRequest, str, str], None],
                 on_retire: Callable[[Work], None]) -> None:
        self.pool = pool
        self.max_batch_size = max_batch_size
        self.max_step_tokens = max_step_tokens
        self.vocab = vocab
        self.work: list[Work] = []
        self._end_request = end_request
        self._on_retire = on_retire

    @property
    def running(self) -> int:
        return sum(w.choices for w in self.work)

    # ------------------------------------------------------------------ admission and retirement
    def admit(self, waiting: deque[GenerationRequest], lock: threading.Condition, version: int
              ) -> list[GenerationRequest]:
        """Move waiting requests into the batch while slots and KV blocks allow; returns those admitted."""
        out: list[GenerationRequest] = []
        free = self.max_batch_size - self.running
        while True:
            with lock:
                if not waiting:
                    return out
                req = waiting[0]
                if req.n > free and self.work:
                    return out
                bad = next((t for t in req.prompt_ids if not (isinstance(t, int) and 0 <= t < self.vocab)), None)
                need = -(-len(req.prompt_ids) // self.pool.block_size) + req.n
                if bad is None and need > self.pool.free_blocks and self.work:
                    return out  # wait for rows to finish and give their blocks back
                waiting.popleft()
            out.append(req)
            if bad is not None:
                self._end_request(req, "error", f"IndexError: prompt token id {bad} is outside the model's "
                                                f"vocabulary (0..{self.vocab - 1})")
                continue
            work = Work(req, list(req.prompt_ids), version)
            work.reuse_prefix(self.pool)
            self.work.append(work)
            free -= req.n

    def drop_cancelled(self, waiting: deque[GenerationRequest], lock: threading.Condition) -> None:
        for w in [w for w in self.work if w.request.cancelled.is_set()]:
            self.end_work(w, "cancelled")
        with lock:
            gone = [r for r in waiting if r.cancelled.is_set()]
            for req in gone:
                waiting.remove(req)
        for req in gone:
            self._end_request(req, "cancelled", "")

    def end_work(self, w: Work, reason: str, error: str | None = None) -> None:
        if w.seq is None:
            self._end_request(w.request, reason, error or "")
        elif w.seq.finish_reason is None:
            w.seq.end(reason, error)
        self.retire(w)

    def retire(self, w: Work) -> None:
        w.drop_kv(self.pool)
        if w in self.work:
            self.work.remove(w)
        self._on_retire(w)

    # ------------------------------------------------------------------ one step's plan
    def plan(self) -> list[tuple[Work, int]]:
        """(work, tokens to feed) for this step: every decoding choice, then prefills within the token budget;
        blocks are reserved here, preempting the youngest choices when the pool runs out."""
        decodes = [w for w in self.work if w.pending == 1]
        prefills = sorted((w for w in self.work if w.pending > 1), key=lambda w: w.order)
        budget = max(self.max_step_tokens - len(decodes), min(64, self.max_step_tokens))
        plan: list[tuple[Work, int]] = []
        preempted_now: set[int] = set()
        inflight: set[int] = set()  # prefix-cache keys of the blocks this step's prefills complete
        for w in [*decodes, *prefills]:
            if w not in self.work or (w.pending > 1 and id(w) in preempted_now):
                continue  # ended, or preempted below while reserving for an older item: resumed next step
            if w.pending > 1 and w.table.computed == len(w.table.hashes) * self.pool.block_size:
                # nothing computed by itself yet (new, preempted, or swapped to new weights): take what is
                # cached now, and wait a step if an older prefill is computing its next block right now
                w.drop_kv(self.pool)
                w.reuse_prefix(self.pool)
                if self._next_block_hash(w) in inflight:
                    continue
            n = 1 if w.pending == 1 else min(w.pending, budget)
            if n < 1:
                continue
            if n > 1:
                inflight.update(self._block_hashes(w, n))
            if not self._reserve(w, n, plan, preempted_now):
                continue
            if w.pending > 1:
                budget -= n
            plan.append((w, n))
        if not plan and self.work:  # prompts alone fill the pool and none can advance: refuse the youngest
            self.end_work(max(self.work, key=lambda w: w.order), "error", POOL_TOO_SMALL)
        return plan

    def _block_hashes(self, w: Work, n: int) -> list[int]:
        """Prefix-cache keys of the full blocks that feeding `n` more tokens of `w` completes."""
        bs = self.pool.block_size
        out, parent = [], w.table.hashes[-1] if w.table.hashes else w.root
        for i in range(len(w.table.hashes), (w.table.computed + n) // bs):
            parent = self.pool.chain(parent, tuple(w.tokens[i * bs:(i + 1) * bs]))
            out.append(parent)
        return out

    def _next_block_hash(self, w: Work) -> int | None:
        """Key of the next full block `w` would compute (None: none left to share; its last token is always
        computed). Called when w has computed nothing past its registered blocks."""
        if w.table.computed + self.pool.block_size > len(w.tokens) - 1:
            return None
        return self._block_hashes(w, self.pool.block_size)[0]

    def _reserve(self, w: Work, n: int, plan: list[tuple[Work, int]], preempted_now: set[int]) -> bool:
        while True:
            try:
                self.pool.ensure(w.table, w.table.computed + n)
                return True
            except PoolExhausted:
                planned = {id(p) for p, _ in plan}
                victims = [v for v in self.work if v is not w and v.seq is not None and v.table.blocks
                           and id(v) not in planned]
                if not victims:
                    if plan or len(self.work) > 1:
                        return False  # wait: rows in this step will finish and free blocks
                    self.end_work(w, "error", POOL_TOO_SMALL)
                    return False
                victim = max(victims, key=lambda v: v.order)
                log.info("KV pool full: preempting a choice of request %s (resumed later)",
                         victim.request.request_id or "(unnamed)")
                victim.drop_kv(self.pool)
                preempted_now.add(id(victim))
