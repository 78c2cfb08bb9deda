"""Continuous batched decoding on one dedicated thread, over a paged KV pool with prefix caching.

Each step packs every new token into one forward pass, one token per batch row (no padding): a token for each
decoding choice and, within a token budget (`max_step_tokens`), prompt tokens of requests being prefilled, a long
prompt over several steps (chunked prefill). Attention reads each sequence's KV in place from the block pool
(paged_attention.py); rows join and leave without copying anyone's cache (kv_pool.py). A request's `n` choices
prefill their prompt once and share its blocks; a prompt that starts with a conversation the engine has seen
reuses that conversation's KV from the prefix cache (evicted least-recently-used when the pool runs short); when
the pool is full the youngest choice is preempted (its KV dropped) and resumed later by prefilling its text again.

Weight updates never drain the batch. `swap_mode="finish"`: requests in flight finish on the weights they started
with (kept in a second copy of the model until they end) while new requests start on the new ones; every
completion then comes from one policy version. `swap_mode="resume"`: the weights are swapped in place at once and
every request in flight is resumed on them (its text so far prefilled again under the new weights), so a
completion's tokens may come from two versions; each token's event carries the version that produced it.

A peft model holding LoRA adapters serves each row with the adapter its request names (peft's mixed-adapter
batches, `adapter_names` per token). On CPU, while a seeded request is in a pass, linear layers are batch-invariant
(invariant.py), and the blocked attention always is, so a seeded request samples the same tokens with the same
logprobs however concurrent requests happen to be batched and whatever the prefix cache held.

Split by concern, as the serving engines it is measured against are: this module is the engine core (its
thread, the queues other threads hand it work through, the policy version, weight updates and releases);
scheduler.py decides what runs each step (admission, chunked prefill within a token budget, preemption);
kv_pool.py is the block manager; model_runner.py holds the weights and runs the forward pass and sampling.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Mapping
from typing import Literal

import torch

from rllm_core.errors import ConfigError
from rllm_serve.attention_kernel import kernel_available, kv_dtype, set_kernel_threads
from rllm_serve.engine_requests import WeightRelease, WeightUpdate
from rllm_serve.invariant import make_batch_invariant
from rllm_serve.kv_pool import BLOCK_SIZE, KVPool, pool_shape
from rllm_serve.model_runner import ModelRunner
from rllm_serve.models import LoadedModel
from rllm_serve.scheduler import Scheduler
from rllm_serve.sequence import GenerationRequest, Sequence
from rllm_serve.work import Work

__all__ = ["DecodeEngine", "SwapMode", "make_batch_invariant"]

log = logging.getLogger("rllm.serving.engine")

SwapMode = Literal["finish", "resume"]
DEFAULT_KV_CACHE_GB = 1.0


class DecodeEngine:
    """Decodes submitted requests together; thread-safe `submit`, `update_weights`, `stop`.

    The engine owns the thread, the queues other threads hand it work through, and the policy version; each
    step it asks the scheduler (scheduler.py) for a plan and the model runner (model_runner.py) for the
    forward pass and the samples; the KV block manager is kv_pool.py."""

    def __init__(self, loaded: LoadedModel, max_batch_size: int = 32, threads: int | None = None,
                 swap_mode: SwapMode = "finish", kv_cache_gb: float | None = None,
                 max_step_tokens: int = 512, own_model: bool = False) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if swap_mode not in ("finish", "resume"):
            raise ConfigError(f"swap_mode must be 'finish' or 'resume', got {swap_mode!r}")
        if max_step_tokens < 1:
            raise ConfigError(f"max_step_tokens must be >= 1, got {max_step_tokens}")
        self.loaded = loaded
        self.runner = ModelRunner(loaded, own_model)
        self.model = loaded.model
        self.max_batch_size = max_batch_size
        self.threads = threads
        self.swap_mode: SwapMode = swap_mode
        self.policy_version = 0
        self.device = self.runner.device
        self._eos = frozenset(loaded.eos_token_ids)
        self._ctx = loaded.context_length
        self._cond = threading.Condition()
        self._waiting: deque[GenerationRequest] = deque()
        self._updates: deque[WeightUpdate] = deque()
        self._releases: list[WeightRelease] = []
        self._stopping = False
        self._threads_wanted: int | None = None
        self._threads_now = self._own_threads = 0
        layers, kv_heads, head_dim = pool_shape(self.model.config)
        dtype = kv_dtype(next(self.model.parameters()).dtype, self.device)
        per_block = KVPool.bytes_per_block(layers, kv_heads, head_dim, dtype)
        budget = int((DEFAULT_KV_CACHE_GB if kv_cache_gb is None else kv_cache_gb) * 2**30) // per_block
        enough = max_batch_size * -(-self._ctx // BLOCK_SIZE) + 1  # every row at full context: more is never needed
        self.pool = KVPool(layers, kv_heads, head_dim, max(2, min(budget, enough)), dtype, self.device)
        self.scheduler = Scheduler(self.pool, max_batch_size, max_step_tokens, self.runner.vocab,
                                   end_request=self._end_request, on_retire=self._retired)
        self._thread = threading.Thread(target=self._run, name="rllm-decode", daemon=True)

    @property
    def adapters(self) -> tuple[str, ...]:
        """LoRA adapters requests can name (peft model); () for a plain model."""
        return self.runner.adapters

    @property
    def batch_invariant(self) -> bool:
        return self.runner.batch_invariant

    @property
    def max_step_tokens(self) -> int:
        return self.scheduler.max_step_tokens

    # ------------------------------------------------------------------ public, any thread
    def start(self) -> DecodeEngine:
        self._thread.start()
        return self

    def submit(self, request: GenerationRequest) -> None:
        if request.adapter is not None and request.adapter not in self.adapters:
            served = f"the served adapters are {list(self.adapters)}" if self.adapters else "a plain model is served"
            raise ConfigError(f"adapter {request.adapter!r} is not served here ({served}); name one of them or None")
        with self._cond:
            if self._stopping:
                raise RuntimeError("the policy server is stopping")
            self._waiting.append(request)
            self._cond.notify()

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], timeout: float | None = None,
                       version: int | None = None) -> int:
        """Serve new weights from the next step on; returns the new policy version (the old one + 1, or `version`
        when given: a resumed run serves its checkpoint's version, not 1).

        Requests in flight finish on the old weights or resume on the new ones (`swap_mode`); nothing waits for
        them. On timeout (the engine thread busy past it) the update is withdrawn, never applied later.
        """
        upd = WeightUpdate(state_dict, version)
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                raise RuntimeError("the policy server is stopped; start a new one to serve new weights")
            self._updates.append(upd)
            self._cond.notify()
        if not upd.done.wait(timeout):
            with self._cond:
                withdrawn = upd in self._updates
                if withdrawn:
                    self._updates.remove(upd)
            if withdrawn:
                raise TimeoutError(f"weights were not swapped within {timeout} s (the engine was busy); "
                                   "the update was withdrawn")
            upd.done.wait()
        if upd.error is not None:
            raise upd.error
        assert upd.version is not None
        return upd.version

    def release_weights(self, timeout: float = 30) -> bool:
        """Drop the packed weights while idle, for a trainer's update (-0.45 GiB at its peak on 135M); requests
        wait until an `update_weights` with every weight. False (nothing dropped) when busy or nothing is packed."""
        req = WeightRelease()
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                return False
            self._releases.append(req)
            self._cond.notify()
        return req.done.wait(timeout) and req.released

    @property
    def running(self) -> int:
        return self.scheduler.running

    @property
    def waiting(self) -> int:
        with self._cond:
            return sum(r.n for r in self._waiting)

    def stats(self) -> dict[str, int]:
        """KV pool figures for /health: blocks in use, cached prefix blocks, prefix hits, evictions."""
        p = self.pool
        return {"kv_blocks": p.num_blocks - 1, "kv_blocks_free": p.free_blocks, "kv_blocks_cached": p.cached_blocks,
                "prefix_hit_blocks": p.hits, "kv_evictions": p.evictions}

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(30)

    def set_threads(self, threads: int | None) -> None:
        """torch threads for the steps from now on (None: the engine's own again). The engine thread applies it
        between steps: a trainer running beside the server (asynchronous RL) takes cores for the length of its
        update and gives them back after."""
        self._threads_wanted = threads

    def _apply_threads(self) -> None:
        want = self._threads_wanted or self._own_threads
        if want != self._threads_now:
            torch.set_num_threads(want)
            set_kernel_threads(want)
            self._threads_now = want

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
            set_kernel_threads(self.threads)
        self._threads_now = self._own_threads = torch.get_num_threads()
        kernel = kernel_available(self.pool.keys[0].dtype, self.device)  # compiled now, not in the 1st request
        # measured with this thread's thread count, as every step runs
        self.runner.pack(max(self.max_batch_size, 64), kernel)
        scheduler = self.scheduler
        while True:
            with self._cond:
                while not (self._stopping or self._updates or self._releases
                           or ((self._waiting or scheduler.work) and not self.runner.released)):
                    self._cond.wait()
                if self._stopping:
                    break
            admitted: list[GenerationRequest] = []
            try:
                scheduler.drop_cancelled(self._waiting, self._cond)
                self._apply_updates()
                self._serve_releases()
                released = self.runner.released
                admitted = scheduler.admit(self._waiting, self._cond, self.policy_version) if not released else []
                if scheduler.work and not released:
                    self._apply_threads()
                    self.runner.refresh()
                    self._step()
            except Exception as exc:  # never let one bad step kill the thread every request waits on
                log.exception("decode loop failed; failing the running sequences")
                error = f"{type(exc).__name__}: {exc}"
                joined = {id(w.request) for w in scheduler.work}
                for w in list(scheduler.work):
                    scheduler.end_work(w, "error", error)
                for req in admitted:  # taken from the queue but maybe never reached: their clients must not hang
                    if id(req) not in joined:
                        self._end_request(req, "error", error)
                scheduler.work.clear()
        for w in list(scheduler.work):
            scheduler.end_work(w, "abort", "the policy server stopped")
        for req in self._waiting:
            self._end_request(req, "abort", "the policy server stopped")
        for upd in self._updates:
            upd.error = RuntimeError("the policy server stopped before the weights were swapped")
            upd.done.set()
        scheduler.work.clear()

    def _apply_updates(self) -> None:
        while True:
            with self._cond:
                if not self._updates:
                    return
                upd = self._updates.popleft()
            try:
                current = [w for w in self.scheduler.work if w.version == self.policy_version]
                self.runner.swap(upd.state_dict, current, self.policy_version, self.swap_mode == "finish", self.pool)
                self.policy_version = self.policy_version + 1 if upd.target is None else upd.target
                upd.version = self.policy_version
                for w in self.scheduler.work:
                    if w.version not in self.runner.old_models:  # resumed (or nothing old kept): the new weights
                        w.version = self.policy_version
                        if w.seq is not None:
                            w.seq.policy_version = self.policy_version
            except BaseException as exc:  # reported to the caller, never kills the engine
                upd.error = exc
            upd.done.set()

    def _serve_releases(self) -> None:
        with self._cond:
            reqs, self._releases = self._releases, []
            idle = not self.scheduler.work and not self._waiting and not self.runner.old_models
        for req in reqs:
            if idle:
                req.released = self.runner.release(self.pool)
            req.done.set()

    def _retired(self, w: Work) -> None:
        """Work left the batch: an older version's weights go once its last request has ended."""
        if w.version in self.runner.old_models and not any(o.version == w.version for o in self.scheduler.work):
            self.runner.retire_version(w.version)

    def _new_sequences(self, req: GenerationRequest, version: int) -> list[Sequence]:
        seqs = []
        for i in range(req.n):
            gen = torch.Generator(device=self.device)
            # any int64 seed + choice index, folded into the generator's uint64 range
            gen.manual_seed((req.params.seed + i) % 2**64 if req.params.seed is not None else random.getrandbits(63))
            seqs.append(Sequence(req, i, version, self.loaded.tokenizer, self._eos, self._ctx, gen))
        return seqs

    def _end_request(self, req: GenerationRequest, reason: str, error: str) -> None:
        """End every choice of a request that holds no work (failed to join, or the server stops)."""
        for i in range(req.n):
            Sequence(req, i, self.policy_version, None, self._eos, self._ctx).end(reason, error)

    # ------------------------------------------------------------------ one step
    @torch.inference_mode()
    def _step(self) -> None:
        plan = self.scheduler.plan()
        if not plan:
            return
        by_version: dict[int, list[tuple[Work, int]]] = {}
        for w, n in plan:
            by_version.setdefault(w.version, []).append((w, n))
        for version, items in by_version.items():
            try:
                logits = self.runner.forward(self.pool, items, version, self.policy_version)
            except Exception as exc:
                log.exception("forward pass failed; failing its %d requests", len(items))
                for w, _ in items:
                    self.scheduler.end_work(w, "error", f"{type(exc).__name__}: {exc}")
                continue
            for w, _ in items:
                self.pool.register(w.table, w.root, w.tokens)
            done = [w for w, n in items if w.pending == 0]
            self._sample(done, logits)

    def _sample(self, done: list[Work], logits_KV: torch.Tensor) -> None:
        """Sample the next token of every item whose feed reached its end (a prompt forks into its choices)."""
        work = self.scheduler.work
        rows: list[tuple[Work, Sequence, int]] = []
        for k, w in enumerate(done):
            if w.seq is not None:
                rows.append((w, w.seq, k))
                continue
            seqs = self._new_sequences(w.request, w.version)
            work.remove(w)
            for child in w.fork(self.pool, seqs):
                work.append(child)
                assert child.seq is not None
                rows.append((child, child.seq, k))
        if not rows:
            return
        order = [k for _, _, k in rows]
        seqs = [s for _, s, _ in rows]
        if order != list(range(logits_KV.shape[0])):  # a prompt forked: gather its row for each choice
            logits_KV = logits_KV[torch.tensor(order, dtype=torch.long, device=logits_KV.device)]
        tokens, chosen, tops = self.runner.sample(logits_KV, [s.params for s in seqs], [s.generator for s in seqs])
        for (w, s, _), tok, lp, top in zip(rows, tokens, chosen, tops, strict=True):
            s.append(tok, lp, top)
            if s.finish_reason is None:
                w.tokens.append(tok)
            else:
                self.scheduler.retire(w)
