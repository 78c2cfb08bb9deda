"""Continuous batched decoding on one dedicated thread.

Every running choice is one row of a single left-padded KV cache. Between decode steps, finished or
cancelled rows leave (their cache rows are dropped) and waiting requests join: each new prompt is prefilled
alone (no padding, so no fully-masked rows and no NaNs), its cache repeated for `n` choices, then zero-padded
on the left and concatenated to the running cache. A decode step feeds one token per row with an attention
mask over the real positions and explicit position ids (number of real tokens so far), so a row's numbers do
not depend on what else is in the batch.

Weight updates drain: `update_weights` stops admissions, lets the running sequences finish on the weights they
started with, swaps in place, bumps `policy_version`, and resumes. So every completion is produced by exactly
one policy version, the one its response reports.

A peft model holding LoRA adapters serves each row with the adapter its request names (`GenerationRequest.adapter`,
None = the base weights): every forward pass passes peft one adapter name per row (`adapter_names`, peft's
mixed-adapter batches), so rows of different adapters share the batch and the KV cache. peft computes the base
layer for all rows and each adapter's LoRA product on that adapter's rows only, the same operations as a pass with
that one adapter active, so a row's numbers are those of its own adapter (and, with `make_batch_invariant`, the
same bits however the batch is mixed: the LoRA matmuls go through the same padded linear layers).

On CPU, while a seeded request is in the batch, every row's numbers are the same bits whatever else is in the
batch (`make_batch_invariant`), so a seeded request samples the same tokens with the same logprobs however
concurrent requests happen to be batched: that is what makes a seeded training run repeat bit for bit. Unseeded
batches keep the plain (faster) kernels.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import random
import threading
import types
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rllm_backends.local_torch.serving.kv_cache import BatchCache
from rllm_backends.local_torch.serving.models import BASE_ADAPTER, LoadedModel, lora_adapters
from rllm_backends.local_torch.serving.sampling import sample_tokens, scaled_logprobs, top_logprobs
from rllm_backends.local_torch.serving.sequence import GenerationRequest, Sequence
from rllm_core.errors import ConfigError

__all__ = ["DecodeEngine", "make_batch_invariant"]

log = logging.getLogger("rllm.serving.engine")

GEMM_ROW_BLOCK = 4
"""CPU matmuls compute rows in blocks of 4 and the 1-3 rows left over with other kernels (measured here: a row's
product has the same bits in every full block, at any row count and position, and other bits in a remainder), so
batch-invariant linear layers are fed a multiple of this many rows."""
ROW_ATTENTION = "rllm_row_sdpa"
"""The attention implementation `make_batch_invariant` installs (registered with transformers on import)."""

_invariant = threading.local()
"""`.on` while the engine thread runs a forward pass that must be batch-invariant (one with a seeded row)."""


@contextlib.contextmanager
def _batch_invariant(on: bool) -> Iterator[None]:
    before = getattr(_invariant, "on", False)
    _invariant.on = on
    try:
        yield
    finally:
        _invariant.on = before


def _padded_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`F.linear`; in a batch-invariant pass, on rows zero-padded to a multiple of GEMM_ROW_BLOCK (padding dropped)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    extra = -rows % GEMM_ROW_BLOCK
    if not extra or not getattr(_invariant, "on", False):
        return F.linear(x, self.weight, self.bias)
    flat = x.reshape(rows, x.shape[-1])
    padded = torch.cat([flat, flat.new_zeros(extra, flat.shape[-1])])
    return F.linear(padded, self.weight, self.bias)[:rows].reshape(*x.shape[:-1], -1)


def _row_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA; in a batch-invariant decode step, one row at a time over that row's real positions only.

    The batch cache left-pads short rows, and how much depends on the other rows; SDPA over padded keys sums in
    another order (other bits) for another pad. Each row attends over its own slice instead, so its result depends
    on its own tokens alone. The mask is SDPA's (boolean, True = attend; None when nothing is masked), and a row's
    real keys are a suffix of the cache. A prefill (one prompt, alone) is ordinary SDPA.
    """
    if query.shape[2] != 1 or not getattr(_invariant, "on", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    gqa = query.shape[1] != key.shape[1]
    length = key.shape[2]
    real = None if attention_mask is None else attention_mask[:, 0, -1, :]
    starts = [0] * key.shape[0] if real is None else (length - real.sum(-1)).tolist()
    outs = []
    for i, start in enumerate(starts):
        k, v = key[i: i + 1, :, int(start):], value[i: i + 1, :, int(start):]
        outs.append(F.scaled_dot_product_attention(query[i: i + 1], k, v, scale=scaling, enable_gqa=gqa))
    return torch.cat(outs).transpose(1, 2).contiguous(), None


AttentionInterface.register(ROW_ATTENTION, _row_attention)
AttentionMaskInterface.register(ROW_ATTENTION, sdpa_mask)  # the boolean masks SDPA gets


def make_batch_invariant(model: torch.nn.Module) -> bool:
    """Let the engine run passes in which each row's logits are independent of the rest of the batch, bit for
    bit (CPU): linear layers see a multiple of GEMM_ROW_BLOCK rows, decode attention runs per row over its real
    positions. Outside such a pass the model computes as before. Returns False (model unchanged) for a model
    whose attention cannot be swapped.

    The engine turns it on for passes with a seeded row (a seeded request promises the same tokens and logprobs
    on every run); the price is a loop over rows per layer in decode attention and up to 3 padded rows per
    matmul: a SmolLM2-135M decode step here took 187 ms instead of 182 at 16 rows, 147 instead of 76 for a lone
    row (a 4-row matmul instead of a matrix-vector product). GPUs are not covered: their kernels vary with shape
    in ways this cannot pin down.
    """
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None or not getattr(model, "_can_set_attn_implementation", lambda: False)():
        return False
    setter(ROW_ATTENTION)
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = types.MethodType(_padded_linear, module)  # type: ignore[method-assign]
    return True


class _WeightUpdate:
    def __init__(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.state_dict = state_dict
        self.done = threading.Event()
        self.target = version
        self.version: int | None = None
        self.error: BaseException | None = None


class DecodeEngine:
    """Decodes submitted requests together; thread-safe `submit`, `update_weights`, `stop`."""

    def __init__(self, loaded: LoadedModel, max_batch_size: int = 32, threads: int | None = None) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.loaded = loaded
        self.model = loaded.model
        self.max_batch_size = max_batch_size
        self.threads = threads
        self.policy_version = 0
        self.device = next(self.model.parameters()).device
        self._eos = frozenset(loaded.eos_token_ids)
        self._ctx = loaded.context_length
        self._cond = threading.Condition()
        self._waiting: deque[GenerationRequest] = deque()
        self._updates: deque[_WeightUpdate] = deque()
        self._stopping = False
        self._rows: list[Sequence] = []
        self._batch = BatchCache(self.device)
        self._next_B: torch.Tensor | None = None
        self.adapters: tuple[str, ...] = tuple(lora_adapters(self.model))
        """LoRA adapters requests can name (peft model); () for a plain model."""
        inner = self.model.get_base_model() if self.adapters else self.model  # peft's forward takes **kwargs
        params = inspect.signature(inner.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.batch_invariant = self.device.type == "cpu" and make_batch_invariant(self.model)
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
        """Swap weights once running sequences finish; returns the new policy version (the old one + 1, or
        `version` when given: a resumed run serves its checkpoint's version, not 1).

        On timeout the update is withdrawn (never applied later) and admissions resume.
        """
        upd = _WeightUpdate(state_dict, version)
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
                    self._cond.notify()
            if withdrawn:
                raise TimeoutError(f"weights were not swapped within {timeout} s (sequences still running); "
                                   "the update was withdrawn")
            upd.done.wait()  # already being applied: finishing takes a moment
        if upd.error is not None:
            raise upd.error
        assert upd.version is not None
        return upd.version

    @property
    def running(self) -> int:
        return len(self._rows)

    @property
    def waiting(self) -> int:
        with self._cond:
            return sum(r.n for r in self._waiting)

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
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self._rows or self._updates):
                    self._cond.wait()
                if self._stopping:
                    break
                admitted = self._take_admissions()
            try:
                self._iterate(admitted)
            except Exception as exc:  # never let one bad step kill the thread every request waits on
                log.exception("decode loop failed; failing the running sequences")
                error = f"{type(exc).__name__}: {exc}"
                joined = {id(seq.request) for seq in self._rows}
                for seq in self._rows:
                    seq.end("error", error)
                for req in admitted:  # taken from the queue but maybe never reached: their clients must not hang
                    if id(req) not in joined:
                        self._end_request(req, "error", error)
                self._reset_batch()
        for seq in self._rows:
            seq.end("abort", "the policy server stopped")
        for req in self._waiting:
            self._end_request(req, "abort", "the policy server stopped")
        for upd in self._updates:
            upd.error = RuntimeError("the policy server stopped before the weights were swapped")
            upd.done.set()
        self._reset_batch()

    def _iterate(self, admitted: list[GenerationRequest]) -> None:
        """One turn of the loop: drop cancelled rows, swap weights if drained, admit, decode one step."""
        self._drop_cancelled()
        if self._updates and not self._rows:
            self._apply_updates()  # requests admitted just before an update arrived then run on the new weights
        for req in admitted:
            self._admit(req)
        if self._rows:
            self._step()

    def _take_admissions(self) -> list[GenerationRequest]:
        """Requests that fit in the batch now (none while a weight update is draining the batch)."""
        out: list[GenerationRequest] = []
        free = self.max_batch_size - len(self._rows)
        while self._waiting and not self._updates:
            req = self._waiting[0]
            if req.n > free and (self._rows or out):
                break
            out.append(self._waiting.popleft())
            free -= req.n
        return out

    def _apply_updates(self) -> None:
        while True:
            with self._cond:
                if not self._updates:
                    return
                upd = self._updates.popleft()
            try:
                self._load_state_dict(upd.state_dict)
                self.policy_version = self.policy_version + 1 if upd.target is None else upd.target
                upd.version = self.policy_version
            except BaseException as exc:  # reported to the caller, never kills the engine
                upd.error = exc
            upd.done.set()

    @torch.no_grad()
    def _load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
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
        for k, v in state_dict.items():
            own[k].copy_(v.detach().to(own[k].device, own[k].dtype))

    @torch.inference_mode()
    def _drop_cancelled(self) -> None:
        keep = [i for i, s in enumerate(self._rows) if not s.request.cancelled.is_set()]
        for s in self._rows:
            if s.request.cancelled.is_set():
                s.end("cancelled")
        if len(keep) != len(self._rows):
            self._keep_rows(keep)
        with self._cond:
            for req in [r for r in self._waiting if r.cancelled.is_set()]:
                self._waiting.remove(req)

    def _new_sequences(self, req: GenerationRequest) -> list[Sequence]:
        seqs = []
        for i in range(req.n):
            gen = torch.Generator(device=self.device)
            # any int64 seed + choice index, folded into the generator's uint64 range
            gen.manual_seed((req.params.seed + i) % 2**64 if req.params.seed is not None else random.getrandbits(63))
            seqs.append(Sequence(req, i, self.policy_version, self.loaded.tokenizer, self._eos, self._ctx, gen))
        return seqs

    def _end_request(self, req: GenerationRequest, reason: str, error: str) -> None:
        """End every choice of a request that is not in the batch (failed to join, or the server stops)."""
        for i in range(req.n):
            Sequence(req, i, self.policy_version, None, self._eos, self._ctx).end(reason, error)

    @torch.inference_mode()
    def _admit(self, req: GenerationRequest) -> None:
        """Prefill one request alone, sample each choice's first token, and join the running batch.

        A failure here (bad prompt ids, out of memory, ...) fails this request only: its client gets an error
        at once and the running rows keep decoding.
        """
        try:
            seqs = self._new_sequences(req)
            ids_1P = torch.tensor([req.prompt_ids], dtype=torch.long, device=self.device)
            cache = DynamicCache()
            with _batch_invariant(self.batch_invariant and req.params.seed is not None):
                out = self._forward(input_ids=ids_1P, cache=cache, rows=[req.adapter], logits_to_keep=1)
            logits_V = out.logits[0, -1]
            if req.n > 1:
                cache.batch_repeat_interleave(req.n)
            next_n = self._sample(seqs, logits_V[None].expand(req.n, -1))
        except Exception as exc:
            log.exception("prefill failed; failing request %s only", req.request_id or "(unnamed)")
            self._end_request(req, "error", f"{type(exc).__name__}: {exc}")
            return
        prompt_len = len(req.prompt_ids)
        live = [i for i, s in enumerate(seqs) if s.finish_reason is None]
        if not live:
            return
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        if len(live) < req.n:
            kv = [(k[live], v[live]) for k, v in kv]
        self._batch.join(kv, prompt_len)
        self._rows.extend(seqs[i] for i in live)
        self._next_B = next_n[live] if self._next_B is None else torch.cat([self._next_B, next_n[live]])

    @torch.inference_mode()
    def _step(self) -> None:
        """One decode step for every running row; finished rows leave the batch right after."""
        assert self._next_B is not None
        mask_BL, pos_B = self._batch.step_inputs()
        seeded = self.batch_invariant and any(s.params.seed is not None for s in self._rows)
        try:
            with _batch_invariant(seeded):
                out = self._forward(input_ids=self._next_B[:, None], attention_mask=mask_BL, position_ids=pos_B,
                                    cache=self._batch.cache, rows=[s.request.adapter for s in self._rows])
        except Exception as exc:
            log.exception("decode step failed; failing the %d running sequences", len(self._rows))
            for s in self._rows:
                s.end("error", f"{type(exc).__name__}: {exc}")
            self._reset_batch()
            return
        self._batch.advance(mask_BL)
        self._next_B = self._sample(self._rows, out.logits[:, -1])
        keep = [i for i, s in enumerate(self._rows) if s.finish_reason is None]
        if len(keep) != len(self._rows):
            self._keep_rows(keep)

    def _forward(self, cache: Any, rows: list[str | None], **kwargs: Any) -> Any:
        """Call the model with our cache object (transformers >= 5.2 names it `cache`, older `past_key_values`);
        a peft model also gets each row's adapter (`rows`, in batch order; None = base weights)."""
        kwargs[self._cache_kwarg] = cache
        if self.adapters:
            kwargs["adapter_names"] = [BASE_ADAPTER if a is None else a for a in rows]
        return self.model(use_cache=True, **kwargs)

    def _sample(self, seqs: list[Sequence], logits_BV: torch.Tensor) -> torch.Tensor:
        temps_B = torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32, device=logits_BV.device)
        logprobs_BV = scaled_logprobs(logits_BV, temps_B)
        next_B = sample_tokens(logprobs_BV, [s.params for s in seqs], [s.generator for s in seqs])
        chosen_B = logprobs_BV.gather(1, next_B[:, None])[:, 0].tolist()
        for s, tok, lp, lp_V in zip(seqs, next_B.tolist(), chosen_B, logprobs_BV, strict=True):
            top = top_logprobs(lp_V, s.params.top_logprobs) if s.params.top_logprobs else None
            s.append(tok, lp, top)
        return next_B.to(self.device)

    def _keep_rows(self, keep: list[int]) -> None:
        if not keep:
            self._reset_batch()
            return
        assert self._next_B is not None
        self._batch.keep(keep)
        self._next_B = self._next_B[torch.tensor(keep, dtype=torch.long, device=self.device)]
        self._rows = [self._rows[i] for i in keep]

    def _reset_batch(self) -> None:
        self._rows, self._next_B = [], None
        self._batch.clear()
