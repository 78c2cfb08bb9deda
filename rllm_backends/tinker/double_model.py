"""The service side of the Tinker double (`double.py`): a tiny local torch model that samples, scores and trains,
the SamplingClientDouble over it, and the plumbing (errors, injected faults, the log, finished futures).

Kept apart from the client classes so the SDK-shaped surface (`double.py`) stays a thin, signature-faithful layer
and everything that touches tensors lives here. The double checks the *protocol* (what is sent, what comes back,
which logprobs, which loss value, that gradients accumulate until the optimizer step), not LoRA numerics: it trains
all weights of the tiny model, whatever LoRA rank was asked for.

Semantics follow Tinker's documentation:
- logprobs are ``log_softmax(logits / T)`` of the chosen token, over the full vocabulary (before top-k/top-p
  filtering, i.e. unrenormalised); prompt and training logprobs use T = 1.
- built-in losses are token SUMS (``loss:sum``): cross_entropy ``-(logprobs * weights).sum()``; importance_sampling
  ``-(exp(lp - q) * A).sum()``; ppo ``-min(r * A, clip(r, lo, hi) * A).sum()`` (lo/hi default 0.8/1.2);
  cispo ``-(sg(clip(r, lo, hi)) * lp * A).sum()`` (lo/hi default 0.0/4.0). ``lo``/``hi`` come from
  ``loss_fn_config`` keys ``clip_low_threshold`` / ``clip_high_threshold``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import numpy as np
import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture, AwaitableConcurrentFuture
from tinker.types.topk_logprobs import MASK_LOGPROB, TopkLogprobs
from typing_extensions import deprecated

__all__ = [
    "ASYNC_DEPRECATION",
    "BUILTIN_LOSSES",
    "DEFAULT_MAX_TOKENS",
    "FAULT_KINDS",
    "Faults",
    "Generated",
    "LogEntry",
    "SamplingClientDouble",
    "TinyPolicy",
    "bad_request",
    "base_policy",
    "builtin_loss",
    "client_future",
    "http_error",
    "run_op",
]

T = TypeVar("T")

ASYNC_DEPRECATION = "DEPRECATED in the SDK: await the future the sync method returns instead"

DEFAULT_MAX_TOKENS = 128
"""Tokens generated when SamplingParams.max_tokens is None (the real service picks its own limit)."""

_CLIP_DEFAULTS = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}
BUILTIN_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
"""The built-in `loss_fn` names the double computes; the SDK's others (dro, gspo, ...) are refused by name."""

_LOCK = threading.RLock()
"""One lock for every torch call of the double: sampling from a server thread while the train loop steps must not
interleave on a shared module, and serialising keeps seeded runs reproducible."""


@functools.lru_cache(maxsize=4)
def _load(local_name: str) -> Any:
    from rllm_serve.models import load_model

    return load_model(local_name)


def base_policy(local_name: str = "tiny-random") -> TinyPolicy:
    """A fresh, trainable copy of the base model `local_name` (loaded once per process, copied per client)."""
    loaded = _load(local_name)
    with _LOCK:
        model = copy.deepcopy(loaded.model)
    return TinyPolicy(model, loaded.tokenizer, sorted(loaded.eos_token_ids), loaded.context_length)


@dataclass
class Generated:
    """One sampled sequence: its tokens, their logprobs, why it stopped, and top-k alternatives when asked."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    topk: list[list[tuple[int, float]]] | None = None


class TinyPolicy:
    """A causal LM with the four things the double needs: score, sample, train, and copy/save its weights."""

    def __init__(self, model: Any, tokenizer: Any, eos_ids: Sequence[int], context_length: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = list(eos_ids)
        self.context_length = context_length
        self.model.eval()

    def frozen_copy(self) -> TinyPolicy:
        """An independent copy of the current weights, so later training does not move what it samples."""
        with _LOCK:
            model = copy.deepcopy(self.model)
        for p in model.parameters():
            p.requires_grad_(False)
            p.grad = None
        return TinyPolicy(model, self.tokenizer, self.eos_ids, self.context_length)

    # -- scoring ---------------------------------------------------------------------------------------------------
    def logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """Float32 logits [len(tokens), vocab], with the autograd graph when grad is enabled."""
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        return self.model(input_ids=ids).logits[0].float()

    def target_logprobs(self, tokens: Sequence[int], targets: torch.Tensor) -> torch.Tensor:
        """logprobs of `targets` [N] or [N, K] under the model fed `tokens` (position i predicts targets[i])."""
        if len(tokens) != targets.shape[0]:
            raise ValueError(f"target_tokens has {targets.shape[0]} positions but model_input has {len(tokens)} "
                             "tokens; they must be equal (position i of model_input predicts target i)")
        logp = torch.log_softmax(self.logits(tokens), dim=-1)
        idx = targets.long()
        if idx.ndim == 1:
            return logp.gather(-1, idx[:, None])[:, 0]
        return logp.gather(-1, idx)

    def prompt_logprobs(self, tokens: Sequence[int]) -> tuple[np.ndarray, torch.Tensor]:
        """Per-token logprobs of `tokens` (NaN at position 0), and the [len, vocab] log-softmax they came from."""
        with _LOCK, torch.no_grad():
            logp = torch.log_softmax(self.logits(tokens), dim=-1)
        out = np.full(len(tokens), np.nan, dtype=np.float32)
        if len(tokens) > 1:
            ids = torch.tensor(list(tokens[1:]), dtype=torch.long)
            out[1:] = logp[:-1].gather(-1, ids[:, None])[:, 0].numpy()
        return out, logp

    # -- sampling --------------------------------------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], *, max_tokens: int | None, temperature: float, top_k: int,
                 top_p: float, stop: str | Sequence[str] | Sequence[int] | None, generator: torch.Generator,
                 topk_logprobs: int = 0) -> Generated:
        """Autoregressive sampling with a KV cache; see the module docstring for the logprob convention."""
        if not prompt:
            raise ValueError("the prompt is empty; give at least one token")
        budget = self.context_length - len(prompt)
        limit = min(DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens, budget)
        if limit <= 0:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room: context length is "
                             f"{self.context_length}, max_tokens={max_tokens}")
        stop_ids, stop_strs = _stop_sets(stop, self.eos_ids)
        tokens: list[int] = []
        logprobs: list[float] = []
        topk: list[list[tuple[int, float]]] = []
        reason = "length"
        with _LOCK, torch.no_grad():
            out = self.model(input_ids=torch.tensor([list(prompt)]), use_cache=True)
            for _ in range(limit):
                raw = out.logits[0, -1].float()
                token, logprob = _pick(raw, temperature, top_k, top_p, generator)
                tokens.append(token)
                logprobs.append(logprob)
                if topk_logprobs > 0:
                    lp = torch.log_softmax(raw / (temperature if temperature > 0 else 1.0), dim=-1)
                    vals, ids = lp.topk(topk_logprobs)
                    topk.append(list(zip(ids.tolist(), vals.tolist(), strict=True)))
                if token in stop_ids or (stop_strs and _ends_with_stop(self.tokenizer, tokens, stop_strs)):
                    reason = "stop"
                    break
                out = self.model(input_ids=torch.tensor([[token]]), use_cache=True, **self._cache_kwargs(out))
        return Generated(tokens, logprobs, reason, topk if topk_logprobs > 0 else None)

    def _cache_kwargs(self, out: Any) -> dict[str, Any]:
        """The KV cache of `out`, under the name this transformers takes (>= 5.2: `cache`, older: past_key_values)."""
        if "cache" in inspect.signature(self.model.forward).parameters:
            return {"cache": out["cache"]}
        return {"past_key_values": out["past_key_values"]}

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        with _LOCK:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        with _LOCK:
            self.model.load_state_dict(dict(state))


def _stop_sets(stop: str | Sequence[str] | Sequence[int] | None, eos: Sequence[int]) -> tuple[set[int], list[str]]:
    """SamplingParams.stop → (stop token ids, stop strings): None keeps EOS; [] disables every stop, EOS too."""
    if stop is None:
        return set(eos), []
    if isinstance(stop, str):
        return set(eos), [stop]
    items = list(stop)
    if all(isinstance(s, int) for s in items):
        return {int(s) for s in items}, []
    if all(isinstance(s, str) for s in items):
        return set(eos), [str(s) for s in items]
    raise ValueError(f"stop must be a string, a list of strings or a list of token ids, not a mix: {items!r}")


def _ends_with_stop(tokenizer: Any, tokens: list[int], stops: list[str]) -> bool:
    """Whether the text generated so far contains a stop string (the token completing it is kept, then we stop)."""
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    return any(s and s in text for s in stops)


def _pick(raw: torch.Tensor, temperature: float, top_k: int, top_p: float,
          generator: torch.Generator) -> tuple[int, float]:
    """Draw one token from `raw` logits; return it with log_softmax(raw / T) at it (greedy: T taken as 1)."""
    if temperature <= 0:
        token = int(raw.argmax())
        return token, float(torch.log_softmax(raw, dim=-1)[token])
    logp = torch.log_softmax(raw / temperature, dim=-1)
    filtered = logp.clone()
    if 0 < top_k < filtered.numel():
        kth = filtered.topk(top_k).values[-1]
        filtered[filtered < kth] = -float("inf")
    if 0 < top_p < 1:
        sorted_lp, order = filtered.sort(descending=True)
        cum = sorted_lp.exp().cumsum(0)
        drop = cum - sorted_lp.exp() >= top_p
        filtered[order[drop]] = -float("inf")
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator)[0])
    return token, float(logp[token])


def builtin_loss(name: str, target_lp: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                 config: Mapping[str, float | str] | None) -> torch.Tensor:
    """One datum's loss (a scalar SUM over its tokens) for built-in `name`; see the module docstring."""
    if name == "cross_entropy":
        weights = inputs.get("weights")
        w = torch.ones_like(target_lp) if weights is None else weights.to(target_lp.dtype).reshape(target_lp.shape)
        return -(target_lp * w).sum()
    for key in ("logprobs", "advantages"):
        if key not in inputs:
            raise ValueError(f"loss_fn {name!r} needs loss_fn_inputs[{key!r}] (given: {sorted(inputs)})")
    q = inputs["logprobs"].to(target_lp.dtype).reshape(target_lp.shape)
    adv = inputs["advantages"].to(target_lp.dtype).reshape(target_lp.shape)
    ratio = torch.exp(target_lp - q)
    if name == "importance_sampling":
        return -(ratio * adv).sum()
    lo_default, hi_default = _CLIP_DEFAULTS[name]
    cfg = dict(config or {})
    lo = float(cfg.get("clip_low_threshold", lo_default))
    hi = float(cfg.get("clip_high_threshold", hi_default))
    clipped = torch.clamp(ratio, lo, hi)
    if name == "ppo":
        return -torch.min(ratio * adv, clipped * adv).sum()
    return -(clipped.detach() * target_lp * adv).sum()


# -- the service side: errors, faults, the log, futures ----------------------------------------------------------------
def http_error(cls: type[tinker.APIStatusError], status: int, message: str) -> tinker.APIStatusError:
    """A `tinker.APIStatusError` subclass built the way the SDK's HTTP layer builds it (request + response)."""
    request = httpx.Request("POST", "http://tinker-double.invalid/api/v1")
    return cls(message, response=httpx.Response(status, request=request), body={"detail": message})


def _connection_error() -> Exception:
    return tinker.APIConnectionError(request=httpx.Request("POST", "http://tinker-double.invalid/api/v1"),
                                     message="Connection error (injected by the Tinker double).")


FAULT_KINDS: dict[str, Callable[[], Exception]] = {
    "connection": _connection_error,
    "server": lambda: http_error(tinker.InternalServerError, 500, "internal server error (injected by the double)"),
    "rate_limit": lambda: http_error(tinker.RateLimitError, 429, "rate limited (injected by the Tinker double)"),
}
"""Transient failures the SDK's RetryHandler retries: APIConnectionError, and APIStatusError 5xx / 429."""


class Faults:
    """The next N calls of a method (its SDK name, e.g. ``sample``, ``forward_backward``) fail with a transient
    error, raised from the returned future as the SDK raises server failures."""

    def __init__(self, spec: Mapping[str, int | tuple[int, str]] | None = None) -> None:
        self.pending: dict[str, list[str]] = {}
        self.raised: list[tuple[str, Exception]] = []
        for method, value in (spec or {}).items():
            times, kind = (value, "connection") if isinstance(value, int) else value
            self.add(method, times, kind)

    def add(self, method: str, times: int = 1, kind: str = "connection") -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; use one of {', '.join(FAULT_KINDS)}")
        self.pending.setdefault(method, []).extend([kind] * int(times))

    def take(self, method: str) -> Exception | None:
        kinds = self.pending.get(method)
        if not kinds:
            return None
        exc = FAULT_KINDS[kinds.pop(0)]()
        self.raised.append((method, exc))
        return exc


@dataclass
class LogEntry:
    """One call the double's service answered: the SDK method, its main arguments, and what it returned."""

    method: str
    request: dict[str, Any]
    response: Any = None
    error: BaseException | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_op(service: Any, method: str, request: dict[str, Any], fn: Callable[[], T]) -> AwaitableConcurrentFuture[T]:
    """Run `fn` now (in order, like the SDK's per-client request sequencing) and hand back a finished APIFuture;
    an injected fault or a server-side error is set on the future, not raised here."""
    future: Future[T] = Future()
    entry = LogEntry(method, request)
    fault = service.faults.take(method)
    try:
        if fault is not None:
            raise fault
        entry.response = fn()
        future.set_result(entry.response)
    except Exception as exc:  # every service-side failure belongs in the future
        entry.error = exc
        future.set_exception(exc)
    service.log.append(entry)
    return AwaitableConcurrentFuture(future)


@contextlib.contextmanager
def bad_request() -> Iterator[None]:
    """Input the tiny model cannot take (a ValueError from the numerics) answers as the service would: HTTP 400."""
    try:
        yield
    except ValueError as exc:
        raise http_error(tinker.BadRequestError, 400, str(exc)) from None


class _ClientFuture(AwaitableConcurrentFuture[T]):
    """What the SDK's Backcompat*ClientFuture is: an APIFuture of a client that, deprecated, also acts as it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        warnings.warn(f"Reading `.{name}` from the future returned by a client-creation method is deprecated; call "
                      ".result() on the future, or await it, to get the client first.", FutureWarning, stacklevel=2)
        return getattr(self.result(), name)


def client_future(future: AwaitableConcurrentFuture[T]) -> AwaitableConcurrentFuture[T]:
    return _ClientFuture(future.future())


class SamplingClientDouble:
    """`tinker.SamplingClient` over a frozen copy of some weights (or, kind="inflight", the latest published)."""

    def __init__(self, service: Any, base_model: str, policy: Callable[[], TinyPolicy],
                 model_path: str | None) -> None:
        self._service = service
        self._base_model = base_model
        self._policy_ref = policy
        self.model_path = model_path
        self.log: list[LogEntry] = []
        """This client's own entries (each also in `service.log`)."""

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0, topk_sample_logprobs: int = 0,
               target_prompt_logprobs: types.TensorData | None = None, prompt_alt_tokens_k: int = 0,
               prompt_logprobs_last_n: int | None = None) -> APIFuture[types.SampleResponse]:
        """`num_samples` completions of `prompt`; seeded params reproduce. See double_model for logprobs."""
        if prompt_alt_tokens_k < 0:
            raise ValueError(f"prompt_alt_tokens_k must be 0 or greater, got {prompt_alt_tokens_k}")
        if prompt_logprobs_last_n is not None and prompt_logprobs_last_n < 1:
            raise ValueError(f"prompt_logprobs_last_n must be 1 or greater, got {prompt_logprobs_last_n}")
        if prompt_logprobs_last_n is not None and not include_prompt_logprobs:
            raise ValueError("prompt_logprobs_last_n applies to prompt logprobs; set include_prompt_logprobs")
        request = {"prompt": prompt.to_ints(), "num_samples": num_samples, "sampling_params": sampling_params,
                   "include_prompt_logprobs": include_prompt_logprobs, "topk_prompt_logprobs": topk_prompt_logprobs,
                   "topk_sample_logprobs": topk_sample_logprobs, "prompt_logprobs_last_n": prompt_logprobs_last_n}

        def op() -> types.SampleResponse:
            if target_prompt_logprobs is not None or prompt_alt_tokens_k:
                raise http_error(tinker.BadRequestError, 400, "the Tinker double does not implement "
                                 "target_prompt_logprobs or prompt_alt_tokens_k")
            if num_samples < 1:
                raise http_error(tinker.BadRequestError, 400, f"num_samples must be at least 1, got {num_samples}")
            return self._sample(prompt.to_ints(), num_samples, sampling_params, include_prompt_logprobs,
                                topk_prompt_logprobs, topk_sample_logprobs, prompt_logprobs_last_n)

        return self._run("sample", request, op)

    def _run(self, method: str, request: dict[str, Any], op: Callable[[], Any]) -> APIFuture[Any]:
        future = run_op(self._service, method, request, op)
        self.log.append(self._service.log[-1])
        return future

    def _sample(self, tokens: list[int], n: int, params: types.SamplingParams, include_prompt: bool, topk_prompt: int,
                topk_sample: int, last_n: int | None) -> types.SampleResponse:
        policy = self._policy_ref()
        seed = params.seed if params.seed is not None else self._service.rng.getrandbits(63)
        generator = torch.Generator().manual_seed(int(seed))
        sequences = []
        for _ in range(n):
            with bad_request():
                g = policy.generate(tokens, max_tokens=params.max_tokens, temperature=params.temperature,
                                    top_k=params.top_k, top_p=params.top_p, stop=params.stop, generator=generator,
                                    topk_logprobs=topk_sample)
            sequences.append(types.SampledSequence(
                stop_reason=g.stop_reason,  # type: ignore[arg-type]
                sequence_id=self._service._next_sequence_id(),
                tokens_np=np.asarray(g.tokens, dtype=np.int32), logprobs_np=np.asarray(g.logprobs, dtype=np.float32),
                topk_logprobs_np=_topk(g.topk) if g.topk is not None else None))
        prompt_lp = topk_np = None
        if include_prompt or topk_prompt > 0:
            if last_n is not None and not 1 <= last_n <= len(tokens) - 1:
                raise http_error(tinker.BadRequestError, 400, f"prompt_logprobs_last_n={last_n} must be between 1 "
                                 f"and len(prompt) - 1 = {len(tokens) - 1}")
            lp, full = policy.prompt_logprobs(tokens)
            keep_from = len(tokens) - last_n if last_n is not None else 1
            lp[:keep_from] = np.nan
            prompt_lp = lp if include_prompt else None
            if topk_prompt > 0:
                rows: list[list[tuple[int, float]] | None] = [None] * len(tokens)
                vals, ids = full[:-1].topk(topk_prompt, dim=-1)
                for i in range(max(keep_from, 1), len(tokens)):
                    rows[i] = list(zip(ids[i - 1].tolist(), vals[i - 1].tolist(), strict=True))
                topk_np = _topk(rows, k=topk_prompt)
        return types.SampleResponse(sequences=sequences, prompt_logprobs_np=prompt_lp, topk_prompt_logprobs_np=topk_np)

    @deprecated(ASYNC_DEPRECATION, category=FutureWarning)
    async def sample_async(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
                           include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
                           topk_sample_logprobs: int = 0, target_prompt_logprobs: types.TensorData | None = None,
                           prompt_alt_tokens_k: int = 0,
                           prompt_logprobs_last_n: int | None = None) -> types.SampleResponse:
        return await self.sample(prompt, num_samples, sampling_params, include_prompt_logprobs, topk_prompt_logprobs,
                                 topk_sample_logprobs, target_prompt_logprobs, prompt_alt_tokens_k,
                                 prompt_logprobs_last_n)

    def compute_logprobs(self, prompt: types.ModelInput,
                         prompt_logprobs_last_n: int | None = None) -> APIFuture[list[float | None]]:
        """Per-token logprobs of `prompt` (T = 1); None where not scored (position 0, or before the last N)."""
        if prompt_logprobs_last_n is not None and prompt_logprobs_last_n < 1:
            raise ValueError(f"prompt_logprobs_last_n must be 1 or greater, got {prompt_logprobs_last_n}")

        def op() -> list[float | None]:
            res = self._sample(prompt.to_ints(), 1, types.SamplingParams(max_tokens=1), True, 0, 0,
                               prompt_logprobs_last_n)
            return list(res.prompt_logprobs or [])

        return self._run("compute_logprobs", {"prompt": prompt.to_ints(), "last_n": prompt_logprobs_last_n}, op)

    @deprecated(ASYNC_DEPRECATION, category=FutureWarning)
    async def compute_logprobs_async(self, prompt: types.ModelInput,
                                     prompt_logprobs_last_n: int | None = None) -> list[float | None]:
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n)

    def get_tokenizer(self) -> Any:
        return self._policy_ref().tokenizer

    def get_base_model(self) -> str:
        return self._base_model

    @deprecated("DEPRECATED in the SDK: use get_base_model()", category=FutureWarning)
    async def get_base_model_async(self) -> str:
        return self._base_model


def _topk(rows: list[list[tuple[int, float]] | None], k: int | None = None) -> TopkLogprobs:
    """Rows of (id, logprob) → the SDK's dense TopkLogprobs (sentinel 0 / MASK_LOGPROB where a row is empty)."""
    width = k if k is not None else max((len(r) for r in rows if r), default=0)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    lps = np.full((len(rows), width), MASK_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (tid, lp) in enumerate(row or []):
            ids[i, j], lps[i, j] = tid, lp
    return TopkLogprobs(token_ids=ids, logprobs=lps)


class RestClientDouble:
    """`tinker.RestClient`'s `get_server_capabilities` (an APIFuture), answered by the double's service."""

    def __init__(self, service: Any) -> None:
        self._service = service

    def get_server_capabilities(self) -> APIFuture[types.GetServerCapabilitiesResponse]:
        return run_op(self._service, "get_server_capabilities", {}, self._service._capabilities)
