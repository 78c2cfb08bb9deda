"""One choice being decoded: its tokens, logprobs, text, stop-string handling, and the events it emits.

Text is produced incrementally (a short window of ids decoded each step, as vLLM and TGI do) and only the part
that is settled is sent: an incomplete UTF-8 character, or a tail that might still grow into a stop string, is
held back until the next token decides it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rllm_serve.sampling import SamplingParams

__all__ = ["GenerationRequest", "Sequence", "TokenEvent"]


@dataclass(frozen=True)
class TokenEvent:
    """What one choice produced in one decode step (or how it ended).

    `token_id` is None for a final event that carries only a finish reason (e.g. cancelled, error).
    """

    choice: int
    token_id: int | None
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None
    text: str
    finish_reason: str | None
    policy_version: int
    error: str | None = None


Sink = Callable[[TokenEvent], None]


@dataclass
class GenerationRequest:
    """A prompt to decode `n` times; events go to `sink` (called from the engine thread)."""

    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink
    n: int = 1
    request_id: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event)
    adapter: str | None = None
    """The LoRA adapter of a peft-served model to sample with (None: the base weights, no adapter)."""
    vision: Any = None
    """The prompt's images (`vision.VisionInputs`: pixel inputs, image token positions); None: text only."""

    def cancel(self) -> None:
        """Ask the engine to drop this request's sequences before its next decode step."""
        self.cancelled.set()


@dataclass
class Sequence:
    """One choice of a request inside the running batch."""

    request: GenerationRequest
    choice: int
    policy_version: int
    tokenizer: Any
    eos_ids: frozenset[int]
    context_length: int
    generator: torch.Generator | None = None
    """This choice's own random stream (seeded from the request's seed + choice index)."""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent_text: str = ""
    finish_reason: str | None = None
    _prefix: int = 0
    _read: int = 0

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def total_len(self) -> int:
        return len(self.request.prompt_ids) + len(self.token_ids)

    def append(self, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> None:
        """Record a sampled token, decide whether the choice is finished, and emit the settled text."""
        self.token_ids.append(token_id)
        p = self.params
        before = len(self.text)
        self.text += self._detokenize()
        if p.stop:
            start = max(0, before - max(len(s) for s in p.stop) + 1)
            cut = min((i for i in (self.text.find(s, start) for s in p.stop) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.finish_reason = self.text[:cut], "stop"
        if self.finish_reason is None:
            if not p.ignore_eos and (token_id in self.eos_ids or token_id in p.stop_token_ids):
                self.finish_reason = "stop"
            elif len(self.token_ids) >= p.max_tokens or self.total_len >= self.context_length:
                self.finish_reason = "length"
            if self.finish_reason is not None:  # flush a trailing partial character, if any
                self.text += self._decode(self._prefix, len(self.token_ids))[len(self._decode(
                    self._prefix, self._read)):]
        hold = 0 if self.finish_reason else max((len(s) for s in p.stop), default=1) - 1
        settled = self.text[: len(self.text) - hold]
        delta = settled[len(self.sent_text):]
        self.sent_text += delta
        self._emit(TokenEvent(self.choice, token_id, logprob, top, delta, self.finish_reason, self.policy_version))

    def _decode(self, start: int, end: int) -> str:
        return str(self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True))

    def _detokenize(self) -> str:
        """New complete text since the last call, decoding only a short window (cost O(1) per token).

        Decodes ids[prefix:] against ids[prefix:read] so that BPE merges and spaces at the window's edge come
        out as in a full decode; a trailing incomplete UTF-8 character waits for the next token.
        """
        old = self._decode(self._prefix, self._read)
        new = self._decode(self._prefix, len(self.token_ids))
        if len(new) > len(old) and not new.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.token_ids)
            return new[len(old):]
        return ""

    def end(self, reason: str, error: str | None = None) -> None:
        """Finish without a new token (cancelled, failed, or the server is stopping)."""
        self.finish_reason = reason
        self._emit(TokenEvent(self.choice, None, None, None, "", reason, self.policy_version, error))

    def _emit(self, event: TokenEvent) -> None:
        """Hand an event to the request's sink; a sink that fails (its client or loop is gone) cancels it."""
        try:
            self.request.sink(event)
        except Exception:
            self.request.cancel()
