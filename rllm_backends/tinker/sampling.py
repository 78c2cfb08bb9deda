"""A Tinker `SamplingClient` behind the local policy server's HTTP app: the engine side.

`rllm_serve.app.make_app(engine, name)` needs from its engine only `.loaded` (tokenizer,
context_length, eos_token_ids, name), `.policy_version`, `.running`, `.waiting` and `.submit(GenerationRequest)`;
`RunningPolicyServer` adds `.start()` / `.stop()`. `TinkerSamplingEngine` is that interface over Tinker, so the
chat, completions and responses endpoints, streaming, tool-call parsing, token-id fields and error shapes are the
local server's own: an agent behind the gateway cannot tell Tinker from vLLM, and Steps get `token_source="server"`.

Each request is one `sampling_client.sample(...)` call (all `n` choices at once) on the HTTP server's event loop.
Tinker answers whole sequences, so every sampled token (with the logprob Tinker reports for it) is fed through
the local engine's `Sequence`: detokenization, stop strings, finish reasons and TokenEvents are therefore exactly
what the local engine emits. A streamed response arrives in one burst when Tinker's answer does.

Decisions worth knowing:
- Stop conditions. Tinker's `stop` is either strings or token ids, and an explicit list replaces its implicit EOS
  stop. A request with no stop strings, no `stop_token_ids` and EOS on sends `stop=None`, so the service applies
  its own end-of-sequence rule (it knows every EOS id of the model; a tokenizer alone may name only one). Otherwise
  Tinker gets the token ids (EOS unless `ignore_eos`, plus `stop_token_ids`), or, with stop strings, those strings
  plus the text of each stop token, so it still ends early; `Sequence` decides the text and the finish reason
  either way, and tokens Tinker sent after the point `Sequence` stopped at are dropped (never reported, never recorded).
- top_logprobs > 0 asks Tinker for `topk_sample_logprobs=k` and relays its per-token alternatives (a position
  Tinker reports nothing for gets an empty list).
- Transient SDK errors (`rllm_backends.tinker.retry.is_transient`: connection errors, timeouts, HTTP
  408/429/5xx, failed requests not blamed on the user) are retried with exponential backoff (tenacity);
  after the last attempt, or at once for any other error, every choice ends with finish_reason "error" and the
  error text, which the app turns into a 500 (or an error event while streaming). A request whose sequences
  come back without logprobs fails the same way: training cannot use a completion it cannot score.
- `swap(client, version)` replaces the client for requests submitted afterwards; running requests finish on
  the client they started with and report the version they started with.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception, stop_after_attempt, wait_exponential

from rllm_backends.tinker.retry import is_transient
from rllm_backends.tinker.sdk import require_tinker
from rllm_core.errors import ConfigError
from rllm_serve.sampling import SamplingParams
from rllm_serve.sequence import GenerationRequest, Sequence, TokenEvent

__all__ = [
    "DEFAULT_CONTEXT_LENGTH", "TinkerLoaded", "TinkerSamplingEngine", "tinker_sampling_params", "tokenizer_eos_ids",
]

log = logging.getLogger("rllm.tinker.sampling")

DEFAULT_CONTEXT_LENGTH = 32768
"""Used when no context length is given (pass the service's `max_context_length` when you know it)."""


@dataclass
class TinkerLoaded:
    """What the HTTP app reads from `engine.loaded`: the tokenizer, its limits, and the served name."""

    tokenizer: Any
    name: str
    context_length: int = DEFAULT_CONTEXT_LENGTH
    eos_token_ids: set[int] = field(default_factory=set)


def tokenizer_eos_ids(tokenizer: Any) -> set[int]:
    """Every id that ends a completion according to the tokenizer (and its generation config, if it has one)."""
    ids: set[int] = set()
    for src in (getattr(tokenizer, "generation_config", None), tokenizer):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(e) for e in eos)
    return ids


def tinker_sampling_params(p: SamplingParams, eos_ids: Iterable[int], tokenizer: Any) -> Any:
    """The request's parameters as `tinker.types.SamplingParams` (see the module docstring for `stop`)."""
    import tinker

    stop_ids = sorted({*(() if p.ignore_eos else eos_ids), *p.stop_token_ids})
    stop: list[str] | list[int] | None
    if not p.stop and not p.stop_token_ids and not p.ignore_eos:
        stop = None  # the service's own end-of-sequence rule: it knows every EOS id of the model (Qwen3 has two)
    elif p.stop:
        texts = [str(tokenizer.decode([i], skip_special_tokens=False)) for i in stop_ids]
        stop = list(dict.fromkeys([*p.stop, *(t for t in texts if t)]))
    else:
        stop = stop_ids
    return tinker.types.SamplingParams(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                                       top_k=p.top_k if p.top_k else -1, seed=p.seed, stop=stop)


@dataclass
class _FedSequence(Sequence):
    """A `Sequence` fed tokens Tinker already sampled. On the last token Tinker sent, the choice must finish
    even when `Sequence`'s own rules would wait for more (Tinker stopped on a stop string's text, say): the
    token is appended as if max_tokens were reached, so the held-back text is flushed as usual, and the event
    carries Tinker's finish reason instead of that forced "length"."""

    final_reason: str | None = None

    @property
    def params(self) -> SamplingParams:
        p = self.request.params
        return p if self.final_reason is None else replace(p, max_tokens=max(1, len(self.token_ids)))

    def _forced(self) -> bool:
        p = self.request.params
        return len(self.token_ids) < p.max_tokens and self.total_len < self.context_length

    def _emit(self, event: TokenEvent) -> None:
        if self.final_reason is not None and event.finish_reason == "length" and self._forced():
            self.finish_reason = self.final_reason
            event = replace(event, finish_reason=self.final_reason)
        super()._emit(event)


class TinkerSamplingEngine:
    """The policy server's engine interface answered by a Tinker `SamplingClient` (see the module docstring).

    `submit` must be called on the event loop that serves HTTP (the app's handlers do); requests run as tasks
    there, at most `max_concurrency` sample calls at once.
    """

    def __init__(self, sampling_client: Any, *, model_name: str, tokenizer: Any = None,
                 context_length: int | None = None, eos_token_ids: Iterable[int] | None = None,
                 policy_version: int = 0, max_concurrency: int = 64, retry_attempts: int = 5,
                 retry_wait_s: float = 0.5, retry_max_wait_s: float = 16.0, cancel_poll_s: float = 0.05) -> None:
        require_tinker()
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if retry_attempts < 1:
            raise ConfigError(f"retry_attempts must be >= 1 (1 = no retry), got {retry_attempts}")
        ctx = DEFAULT_CONTEXT_LENGTH if context_length is None else int(context_length)
        if ctx < 2:
            raise ConfigError(f"context_length must be >= 2, got {context_length}")
        tok = tokenizer if tokenizer is not None else sampling_client.get_tokenizer()
        eos = set(eos_token_ids) if eos_token_ids is not None else tokenizer_eos_ids(tok)
        self.loaded = TinkerLoaded(tok, model_name, ctx, eos)
        self.max_concurrency = max_concurrency
        self.retry_attempts, self.retry_wait_s, self.retry_max_wait_s = retry_attempts, retry_wait_s, retry_max_wait_s
        self.cancel_poll_s = cancel_poll_s
        self._lock = threading.Lock()
        self._client = sampling_client
        self._version = policy_version
        self._sem = asyncio.Semaphore(max_concurrency)
        # sample calls run here, not on asyncio's default executor (a few workers on a small machine would cap
        # concurrency below max_concurrency); the SDK's `sample` only schedules, a double samples in the call
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="rllm-tinker-sample")
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._running = 0
        self._waiting = 0

    # ------------------------------------------------------------------ the app's interface
    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def sampling_client(self) -> Any:
        return self._client

    @property
    def running(self) -> int:
        """Choices inside a sample call now."""
        return self._running

    @property
    def waiting(self) -> int:
        """Choices waiting for a free slot (or for a retry's backoff to pass)."""
        return self._waiting

    def start(self) -> TinkerSamplingEngine:
        return self

    def swap(self, sampling_client: Any, policy_version: int | None = None) -> int:
        """Serve `sampling_client` from now on as `policy_version` (default: the current one + 1); returns it."""
        with self._lock:
            self._client = sampling_client
            self._version = self._version + 1 if policy_version is None else int(policy_version)
            return self._version

    def submit(self, request: GenerationRequest) -> None:
        if self._stopping:
            raise RuntimeError("the policy server is stopping")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError("TinkerSamplingEngine.submit must be called on the loop of the server serving it")
        with self._lock:
            client, version = self._client, self._version
        task = loop.create_task(self._run(request, client, version))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        """Refuse new requests and end the running ones ("abort", which the app reports as an error)."""
        self._stopping = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        loop = self._loop
        if loop is None or loop.is_closed() or not self._tasks:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            for t in list(self._tasks):
                t.cancel()
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._cancel_all(), loop).result(15)

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ one request
    def _sequences(self, req: GenerationRequest, version: int) -> list[_FedSequence]:
        ld = self.loaded
        return [_FedSequence(req, i, version, ld.tokenizer, frozenset(ld.eos_token_ids), ld.context_length)
                for i in range(req.n)]

    async def _run(self, req: GenerationRequest, client: Any, version: int) -> None:
        """Sample, then feed; watches `req.cancelled` meanwhile (the app sets it when its client goes away)."""
        seqs = self._sequences(req, version)
        inner = asyncio.ensure_future(self._sample(req, client))
        try:
            while not inner.done():
                await asyncio.wait({inner}, timeout=self.cancel_poll_s)
                if req.cancelled.is_set() and not inner.done():
                    inner.cancel()
                    for s in seqs:
                        s.end("cancelled")
                    return
            try:
                response = inner.result()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.warning("tinker sampling failed for request %s: %s", req.request_id or "(unnamed)", error)
                for s in seqs:
                    s.end("error", error)
                return
            self._feed(req, seqs, response)
        except asyncio.CancelledError:
            inner.cancel()
            if not self._stopping:
                raise
            for s in seqs:
                if s.finish_reason is None:
                    s.end("abort", "the policy server stopped")

    async def _sample(self, req: GenerationRequest, client: Any) -> Any:
        import tinker

        params = tinker_sampling_params(req.params, self.loaded.eos_token_ids, self.loaded.tokenizer)
        kwargs: dict[str, Any] = {"prompt": tinker.types.ModelInput.from_ints(list(req.prompt_ids)),
                                  "num_samples": req.n, "sampling_params": params}
        if req.params.top_logprobs:
            kwargs["topk_sample_logprobs"] = req.params.top_logprobs
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient), stop=stop_after_attempt(self.retry_attempts),
            wait=wait_exponential(multiplier=self.retry_wait_s, max=self.retry_max_wait_s), reraise=True,
            before_sleep=before_sleep_log(log, logging.WARNING))
        self._waiting += req.n
        try:
            async for attempt in retrying:
                with attempt:
                    async with self._sem:
                        self._waiting -= req.n
                        self._running += req.n
                        try:
                            # on a worker thread: the SDK's `sample` only schedules, but a client that samples
                            # in the call (the double) must not block the HTTP loop
                            result = await asyncio.get_running_loop().run_in_executor(
                                self._pool, functools.partial(client.sample, **kwargs))
                            return await result if inspect.isawaitable(result) else result
                        finally:
                            self._running -= req.n
                            self._waiting += req.n
        finally:
            self._waiting -= req.n
        raise AssertionError("unreachable: tenacity either returns or reraises")  # pragma: no cover

    def _feed(self, req: GenerationRequest, seqs: list[_FedSequence], response: Any) -> None:
        """Every sampled token through its `Sequence`, so the events are the local engine's."""
        sampled = list(getattr(response, "sequences", None) or [])
        if len(sampled) != len(seqs):
            for s in seqs:
                s.end("error", f"the sampling client returned {len(sampled)} sequences for num_samples={req.n}")
            return
        for seq, out in zip(seqs, sampled, strict=True):
            tokens = [int(t) for t in out.tokens]
            logprobs = out.logprobs
            if logprobs is None or len(logprobs) != len(tokens):
                seq.end("error", f"the sampling client returned {0 if logprobs is None else len(logprobs)} "
                                 f"logprobs for {len(tokens)} tokens; every sampled token needs its logprob")
                continue
            tops = getattr(out, "topk_logprobs", None) if req.params.top_logprobs else None
            reason = str(getattr(out, "stop_reason", None) or "stop")
            if not tokens:
                seq.end(reason)
                continue
            for i, (tok, lp) in enumerate(zip(tokens, logprobs, strict=True)):
                if req.cancelled.is_set():
                    seq.end("cancelled")
                    break
                if i == len(tokens) - 1:
                    seq.final_reason = reason
                top = None
                if req.params.top_logprobs:
                    row = tops[i] if tops is not None and i < len(tops) else None
                    top = [(int(t), float(v)) for t, v in (row or [])]
                seq.append(tok, float(lp), top)
                if seq.finish_reason is not None:
                    break
