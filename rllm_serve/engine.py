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
"""

from __future__ import annotations

import copy
import logging
import random
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal

import torch

from rllm_core.errors import ConfigError
from rllm_serve.attention_kernel import kernel_available, set_kernel_threads
from rllm_serve.engine_requests import WeightRelease, WeightUpdate
from rllm_serve.fast_forward import fusions
from rllm_serve.invariant import batch_invariant, make_batch_invariant
from rllm_serve.kv_pool import BLOCK_SIZE, KVPool, PoolExhausted, pool_shape
from rllm_serve.models import BASE_ADAPTER, LoadedModel, lora_adapters
from rllm_serve.packed_linear import (
    PackedLayers,
    pack_linear_layers,
    packs_released,
    release_packed,
)
from rllm_serve.paged_attention import PAGED_ATTENTION
from rllm_serve.sampling import sample_tokens, scaled_logprobs, top_logprobs_batch
from rllm_serve.sequence import GenerationRequest, Sequence
from rllm_serve.step import run_forward
from rllm_serve.work import Work

__all__ = ["DecodeEngine", "SwapMode", "make_batch_invariant"]

log = logging.getLogger("rllm.serving.engine")

SwapMode = Literal["finish", "resume"]
DEFAULT_KV_CACHE_GB = 1.0
_POOL_TOO_SMALL = ("the KV cache is too small for this request: start the server with a larger kv_cache_gb, "
                   "or send a shorter prompt")


class DecodeEngine:
    """Decodes submitted requests together; thread-safe `submit`, `update_weights`, `stop`."""

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
        self.model = loaded.model
        self.max_batch_size = max_batch_size
        self.threads = threads
        self.swap_mode: SwapMode = swap_mode
        self.max_step_tokens = max_step_tokens
        self.policy_version = 0
        self.device = next(self.model.parameters()).device
        self._eos = frozenset(loaded.eos_token_ids)
        self._ctx = loaded.context_length
        self._vocab = int(self.model.get_input_embeddings().num_embeddings)
        self._cond = threading.Condition()
        self._waiting: deque[GenerationRequest] = deque()
        self._updates: deque[WeightUpdate] = deque()
        self._releases: list[WeightRelease] = []
        self._released = False  # packed weights dropped (release_weights) until a full update: nothing runs
        self._stopping = False
        self._work: list[Work] = []
        self._old_models: dict[int, Any] = {}
        """Earlier policy versions still finishing their requests (swap_mode="finish")."""
        self.adapters: tuple[str, ...] = tuple(lora_adapters(self.model))
        """LoRA adapters requests can name (peft model); () for a plain model."""
        try:
            self.model.set_attn_implementation(PAGED_ATTENTION)
        except (AttributeError, ValueError) as exc:
            raise ConfigError(f"the policy server cannot serve {loaded.name!r}: its transformers class does not "
                              f"take a custom attention implementation ({exc})") from None
        self.batch_invariant = self.device.type == "cpu" and make_batch_invariant(self.model)
        self.own_model = own_model
        """The engine may release the dense weights it packed (nobody else uses this model object)."""
        self._packed = PackedLayers()
        """Linear layers on packed weights (packed on the engine thread, at its start)."""
        layers, kv_heads, head_dim = pool_shape(self.model.config)
        dtype = next(self.model.parameters()).dtype
        per_block = KVPool.bytes_per_block(layers, kv_heads, head_dim, dtype)
        budget = int((DEFAULT_KV_CACHE_GB if kv_cache_gb is None else kv_cache_gb) * 2**30) // per_block
        enough = max_batch_size * -(-self._ctx // BLOCK_SIZE) + 1  # every row at full context: more is never needed
        self.pool = KVPool(layers, kv_heads, head_dim, max(2, min(budget, enough)), dtype, self.device)
        self._thread = threading.Thread(target=self._run, name="rllm-decode", daemon=True)

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

    def _serve_releases(self) -> None:
        with self._cond:
            reqs, self._releases = self._releases, []
            idle = not self._work and not self._waiting and not self._old_models
        for req in reqs:
            if idle and len(self._packed) and not self.adapters:
                self.pool.drop_pages()  # no block is in use: the KV pool's pages go too
                req.released = self._released = release_packed(self._packed) > 0 or self._released
            req.done.set()

    @property
    def running(self) -> int:
        return sum(w.choices for w in self._work)

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

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
            set_kernel_threads(self.threads)
        kernel = kernel_available(self.pool.keys[0].dtype, self.device)  # compiled now, not in the 1st request
        if self.batch_invariant:  # measured with this thread's thread count, as every step runs
            try:
                self._packed = pack_linear_layers(self.model, max(self.max_batch_size, 64), self.own_model,
                                                  fusions(self.model) if kernel else None)
            except Exception:  # the plain padded path still serves
                log.exception("packing the linear layers failed; serving with F.linear")
        while True:
            with self._cond:
                while not (self._stopping or self._updates or self._releases
                           or ((self._waiting or self._work) and not self._released)):
                    self._cond.wait()
                if self._stopping:
                    break
            admitted: list[GenerationRequest] = []
            try:
                self._drop_cancelled()
                self._apply_updates()
                self._serve_releases()
                admitted = self._admit() if not self._released else []
                if self._work and not self._released:
                    self._packed.refresh()  # a model passed in may have been changed in place by its owner
                    self._step()
            except Exception as exc:  # never let one bad step kill the thread every request waits on
                log.exception("decode loop failed; failing the running sequences")
                error = f"{type(exc).__name__}: {exc}"
                joined = {id(w.request) for w in self._work}
                for w in self._work:
                    self._end_work(w, "error", error)
                for req in admitted:  # taken from the queue but maybe never reached: their clients must not hang
                    if id(req) not in joined:
                        self._end_request(req, "error", error)
                self._work = []
        for w in self._work:
            self._end_work(w, "abort", "the policy server stopped")
        for req in self._waiting:
            self._end_request(req, "abort", "the policy server stopped")
        for upd in self._updates:
            upd.error = RuntimeError("the policy server stopped before the weights were swapped")
            upd.done.set()
        self._work = []

    def _admit(self) -> list[GenerationRequest]:
        """Move waiting requests into the batch while slots and KV blocks allow; returns those admitted."""
        out: list[GenerationRequest] = []
        free = self.max_batch_size - self.running
        while True:
            with self._cond:
                if not self._waiting:
                    return out
                req = self._waiting[0]
                if req.n > free and self._work:
                    return out
                bad = next((t for t in req.prompt_ids if not (isinstance(t, int) and 0 <= t < self._vocab)),
                           None)
                need = -(-len(req.prompt_ids) // self.pool.block_size) + req.n
                if bad is None and need > self.pool.free_blocks and self._work:
                    return out  # wait for rows to finish and give their blocks back
                self._waiting.popleft()
            out.append(req)
            if bad is not None:
                self._end_request(req, "error", f"IndexError: prompt token id {bad} is outside the model's "
                                                f"vocabulary (0..{self._vocab - 1})")
                continue
            work = Work(req, list(req.prompt_ids), self.policy_version)
            work.reuse_prefix(self.pool)
            self._work.append(work)
            free -= req.n

    def _apply_updates(self) -> None:
        while True:
            with self._cond:
                if not self._updates:
                    return
                upd = self._updates.popleft()
            try:
                self._swap(upd.state_dict)
                self.policy_version = self.policy_version + 1 if upd.target is None else upd.target
                upd.version = self.policy_version
                for w in self._work:
                    if w.version not in self._old_models:  # resumed (or nothing old kept): the new weights
                        w.version = self.policy_version
                        if w.seq is not None:
                            w.seq.policy_version = self.policy_version
            except BaseException as exc:  # reported to the caller, never kills the engine
                upd.error = exc
            upd.done.set()

    @torch.no_grad()
    def _swap(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        own = self.model.state_dict()
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            hint = ("pass model.state_dict() of the same architecture" if not self.adapters else
                    "pass (a subset of) the PeftModel's own state_dict(), whose LoRA keys name their adapter "
                    f"('...lora_A.<adapter>.weight', adapters here: {list(self.adapters)}); "
                    "get_peft_model_state_dict() drops the adapter name")
            raise ConfigError(f"update_weights: {len(unknown)} keys are not parameters of the served model "
                              f"(first: {unknown[:3]}); {hint}")
        for k, v in state_dict.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ConfigError(f"update_weights: {k} has shape {tuple(v.shape)}, "
                                  f"the served model expects {tuple(own[k].shape)}")
            if v.is_meta or v.is_floating_point() != own[k].is_floating_point():
                raise ConfigError(f"update_weights: {k} is a {'meta' if v.is_meta else str(v.dtype)} tensor; pass "
                                  f"real {own[k].dtype} values (a model loaded on the meta device has none)")
        if self._released and (missing := [k for k in self._packed.by_name if k not in state_dict]):
            raise ConfigError(f"update_weights after release_weights must bring every weight back; {len(missing)} "
                              f"packed weights are missing (first: {missing[0]}); pass the model's full state_dict")
        current = [w for w in self._work if w.version == self.policy_version]
        if current and self.swap_mode == "finish":  # a copy of the old weights serves the requests in flight
            self._old_models[self.policy_version] = copy.deepcopy(self.model)
        elif current:  # resume: their KV is stale; they prefill their text again under the new weights
            for w in current:
                w.drop_kv(self.pool)
        try:
            for k, v in state_dict.items():
                self._packed.update(k, own[k], v)  # packed anew: an old model copy keeps the old ones
            self._packed.finish()
        finally:
            self._packed.discard()
        self.pool.clear_cache()
        if self._released:  # weights dropped by release_weights: served again once none is missing
            self._released = packs_released(self._packed) > 0

    def _drop_cancelled(self) -> None:
        for w in [w for w in self._work if w.request.cancelled.is_set()]:
            self._end_work(w, "cancelled")
        with self._cond:
            gone = [r for r in self._waiting if r.cancelled.is_set()]
            for req in gone:
                self._waiting.remove(req)
        for req in gone:
            self._end_request(req, "cancelled", "")

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

    def _end_work(self, w: Work, reason: str, error: str | None = None) -> None:
        if w.seq is None:
            self._end_request(w.request, reason, error or "")
        elif w.seq.finish_reason is None:
            w.seq.end(reason, error)
        self._retire(w)

    def _retire(self, w: Work) -> None:
        w.drop_kv(self.pool)
        if w in self._work:
            self._work.remove(w)
        if w.version in self._old_models and not any(o.version == w.version for o in self._work):
            del self._old_models[w.version]  # its last request ended: free the old weights

    # ------------------------------------------------------------------ one step
    def _plan(self) -> list[tuple[Work, int]]:
        """(work, tokens to feed) for this step: every decoding choice, then prefills within the token budget;
        blocks are reserved here, preempting the youngest choices when the pool runs out."""
        decodes = [w for w in self._work if w.pending == 1]
        prefills = sorted((w for w in self._work if w.pending > 1), key=lambda w: w.order)
        budget = max(self.max_step_tokens - len(decodes), min(64, self.max_step_tokens))
        plan: list[tuple[Work, int]] = []
        preempted_now: set[int] = set()
        inflight: set[int] = set()  # prefix-cache keys of the blocks this step's prefills complete
        for w in [*decodes, *prefills]:
            if w not in self._work or (w.pending > 1 and id(w) in preempted_now):
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
        if not plan and self._work:  # prompts alone fill the pool and none can advance: refuse the youngest
            self._end_work(max(self._work, key=lambda w: w.order), "error", _POOL_TOO_SMALL)
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
                victims = [v for v in self._work if v is not w and v.seq is not None and v.table.blocks
                           and id(v) not in planned]
                if not victims:
                    if plan or len(self._work) > 1:
                        return False  # wait: rows in this step will finish and free blocks
                    self._end_work(w, "error", _POOL_TOO_SMALL)
                    return False
                victim = max(victims, key=lambda v: v.order)
                log.info("KV pool full: preempting a choice of request %s (resumed later)",
                         victim.request.request_id or "(unnamed)")
                victim.drop_kv(self.pool)
                preempted_now.add(id(victim))

    @torch.inference_mode()
    def _step(self) -> None:
        plan = self._plan()
        if not plan:
            return
        by_version: dict[int, list[tuple[Work, int]]] = {}
        for w, n in plan:
            by_version.setdefault(w.version, []).append((w, n))
        for version, items in by_version.items():
            model = self.model if version == self.policy_version else self._old_models.get(version, self.model)
            seeded = self.batch_invariant and any(w.request.params.seed is not None for w, _ in items)
            try:
                with batch_invariant(seeded):
                    logits = run_forward(model, self.pool, items, bool(self.adapters), BASE_ADAPTER)
            except Exception as exc:
                log.exception("forward pass failed; failing its %d requests", len(items))
                for w, _ in items:
                    self._end_work(w, "error", f"{type(exc).__name__}: {exc}")
                continue
            for w, _ in items:
                self.pool.register(w.table, w.root, w.tokens)
            done = [w for w, n in items if w.pending == 0]
            self._sample(done, logits)

    def _sample(self, done: list[Work], logits_KV: torch.Tensor) -> None:
        """Sample the next token of every item whose feed reached its end (a prompt forks into its choices)."""
        rows: list[tuple[Work, Sequence, int]] = []
        for k, w in enumerate(done):
            if w.seq is not None:
                rows.append((w, w.seq, k))
                continue
            seqs = self._new_sequences(w.request, w.version)
            self._work.remove(w)
            for child in w.fork(self.pool, seqs):
                self._work.append(child)
                assert child.seq is not None
                rows.append((child, child.seq, k))
        if not rows:
            return
        order = [k for _, _, k in rows]
        seqs = [s for _, s, _ in rows]
        temps = torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32, device=logits_KV.device)
        if order != list(range(logits_KV.shape[0])):  # a prompt forked: gather its row for each choice
            logits_KV = logits_KV[torch.tensor(order, dtype=torch.long, device=logits_KV.device)]
        logprobs_BV = scaled_logprobs(logits_KV, temps)
        next_B = sample_tokens(logprobs_BV, [s.params for s in seqs], [s.generator for s in seqs])
        chosen = logprobs_BV.gather(1, next_B[:, None])[:, 0].tolist()
        tops = top_logprobs_batch(logprobs_BV, [s.params.top_logprobs for s in seqs])
        for (w, s, _), tok, lp, top in zip(rows, next_B.tolist(), chosen, tops, strict=True):
            s.append(tok, lp, top)
            if s.finish_reason is None:
                w.tokens.append(tok)
            else:
                self._retire(w)
