"""The one parser/assembler of LLM responses, shared by the gateway and in-process capture.

`CallAssembler` is fed the response bytes as they arrive (a JSON body or an SSE stream) and returns the bytes
the client should see: unchanged, or with the fields we asked for on its behalf (logprobs, token_ids,
prompt_token_ids) removed. `finish()` turns what it saw into one Step per choice. Streams are assembled the
way vLLM sends them: prompt ids in the first chunk, token-id and logprob deltas after, tool-call argument
fragments merged by `tool_calls[i].index`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rllm_core.capture import _json
from rllm_core.capture.request import CallRequest
from rllm_core.capture.retokenize import retokenize_step
from rllm_core.types import Step, TokenSource

__all__ = ["CallAssembler", "error_step"]


@dataclass(slots=True)
class _Choice:
    """One choice, accumulated over chunks (or read at once from a JSON body)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    logprob_tokens: list[str] | None = None
    """The token strings the server gave with its logprobs (chat `content[*].token`): what retokenized ids must
    match, one by one, before its logprobs may be trained on."""
    prompt_token_ids: list[int] | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None

    def add_ids(self, ids: list[int] | None) -> None:
        if ids is not None:
            self.token_ids = ids if self.token_ids is None else [*self.token_ids, *ids]

    def add_logprobs(self, lps: list[float] | None, tokens: list[str] | None = None) -> None:
        if lps is not None:
            self.logprobs = lps if self.logprobs is None else [*self.logprobs, *lps]
        if tokens is not None:
            self.logprob_tokens = tokens if self.logprob_tokens is None else [*self.logprob_tokens, *tokens]

    def merge_tool_calls(self, fragments: list[dict[str, Any]]) -> None:
        for pos, frag in enumerate(fragments):
            idx = frag.get("index", pos)
            slot = self.tool_calls.setdefault(idx, {"id": None, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
            if frag.get("id"):
                slot["id"] = frag["id"]
            if frag.get("type"):
                slot["type"] = frag["type"]
            fn = frag.get("function") or {}
            if fn.get("name"):
                slot["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                slot["function"]["arguments"] += fn["arguments"]


def _logprob_values(lp: Any) -> list[float] | None:
    """Sampled-token logprobs from either shape: chat (`content[*].logprob`) or completions (`token_logprobs`)."""
    if not isinstance(lp, dict):
        return None
    if "content" in lp:
        content = lp.get("content")
        return None if content is None else [float(e["logprob"]) for e in content]
    values = lp.get("token_logprobs")
    return None if values is None else [float(v) for v in values]


def _logprob_tokens(lp: Any) -> list[str] | None:
    """The sampled tokens' strings beside their logprobs (chat `content[*].token`, completions `tokens`)."""
    if not isinstance(lp, dict):
        return None
    if "content" in lp:
        content = lp.get("content")
        return None if content is None else [str(e.get("token", "")) for e in content]
    tokens = lp.get("tokens")
    return None if tokens is None else [str(t) for t in tokens]


class CallAssembler:
    """Parse one response into Steps while passing it on to the client; see the module docstring."""

    def __init__(self, call: CallRequest, *, sse: bool, tokenizer: Any = None) -> None:
        self.call = call
        self.sse = sse
        self.tokenizer = tokenizer
        self.done = False
        """True once the stream's `[DONE]` (or a whole JSON body) has been seen."""
        self._buf = bytearray()
        self._choices: dict[int, _Choice] = {}
        self._top: dict[str, Any] = {}
        self._parse_error: str | None = None

    # ------------------------------------------------------------------ feeding
    def feed(self, data: bytes) -> bytes:
        """Take the next bytes from upstream; return the bytes to pass to the client now."""
        self._buf += data
        if not self.sse:
            return b"" if self.call.strips else data
        out = bytearray()
        while True:
            end, sep_len = self._event_end()
            if end < 0:
                break
            event = bytes(self._buf[: end + sep_len])
            del self._buf[: end + sep_len]
            out += self._on_event(event)
        return data if not self.call.strips else bytes(out)

    def _event_end(self) -> tuple[int, int]:
        i = self._buf.find(b"\n\n")
        j = self._buf.find(b"\r\n\r\n")
        if j >= 0 and (i < 0 or j < i):
            return j, 4
        return i, 2

    def _on_event(self, event: bytes) -> bytes:
        data_lines = [ln[5:].lstrip() for ln in event.splitlines() if ln.startswith(b"data:")]
        if not data_lines:
            return event
        payload = b"\n".join(data_lines)
        if payload.strip() == b"[DONE]":
            self.done = True
            return event
        try:
            chunk = _json.loads(payload)
        except ValueError:
            self._parse_error = f"unparseable SSE event from upstream: {payload[:200]!r}"
            return event
        if not isinstance(chunk, dict):
            return event
        if chunk.get("error") and not chunk.get("choices"):  # vLLM reports mid-stream failures this way
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self._parse_error = f"upstream error mid-stream: {msg}"
        self._absorb_chunk(chunk)
        if not self.call.strips:
            return event
        self._strip(chunk)
        return b"data: " + _json.dumps(chunk) + b"\n\n"

    def _absorb_top(self, obj: dict[str, Any]) -> None:
        for key in ("id", "model", "policy_version", "prompt_token_ids", "usage", "system_fingerprint"):
            value = obj.get(key)
            if value is not None:
                self._top[key] = value

    def _absorb_chunk(self, chunk: dict[str, Any]) -> None:
        self._absorb_top(chunk)
        for pos, ch in enumerate(chunk.get("choices") or []):
            c = self._choices.setdefault(int(ch.get("index", pos)), _Choice())
            delta = ch.get("delta")
            if isinstance(delta, dict):
                if delta.get("content"):
                    c.text.append(delta["content"])
                if delta.get("tool_calls"):
                    c.merge_tool_calls(delta["tool_calls"])
            elif ch.get("text"):
                c.text.append(ch["text"])
            c.add_ids(ch.get("token_ids"))
            c.add_logprobs(_logprob_values(ch.get("logprobs")), _logprob_tokens(ch.get("logprobs")))
            if ch.get("prompt_token_ids") is not None:
                c.prompt_token_ids = ch["prompt_token_ids"]
            if ch.get("finish_reason"):
                c.finish_reason = ch["finish_reason"]

    def _absorb_body(self, body: dict[str, Any]) -> None:
        self._absorb_top(body)
        for pos, ch in enumerate(body.get("choices") or []):
            c = self._choices.setdefault(int(ch.get("index", pos)), _Choice())
            msg = ch.get("message")
            if isinstance(msg, dict):
                if msg.get("content"):
                    c.text.append(msg["content"])
                if msg.get("tool_calls"):
                    c.tool_calls = dict(enumerate(msg["tool_calls"]))
            elif ch.get("text") is not None:
                c.text.append(ch["text"])
            c.token_ids = ch.get("token_ids")
            c.logprobs = _logprob_values(ch.get("logprobs"))
            c.logprob_tokens = _logprob_tokens(ch.get("logprobs"))
            c.prompt_token_ids = ch.get("prompt_token_ids")
            c.finish_reason = ch.get("finish_reason")

    def _strip(self, obj: dict[str, Any]) -> None:
        """Remove from a body/chunk (in place) what we asked for and the client did not."""
        if not self.call.wants_token_ids:
            obj.pop("prompt_token_ids", None)
        for ch in obj.get("choices") or []:
            if not self.call.wants_logprobs:
                ch.pop("logprobs", None)
            if not self.call.wants_token_ids:
                ch.pop("token_ids", None)
                ch.pop("prompt_token_ids", None)

    # ------------------------------------------------------------------ finishing
    def finish(self, error: str | None = None) -> tuple[bytes, list[Step]]:
        """End of the response (or of our part in it): the last bytes for the client, and the Steps."""
        tail = b""
        if not self.sse:
            raw = bytes(self._buf)
            tail = raw if self.call.strips else b""
            try:
                body = _json.loads(raw)
            except ValueError:
                body = None
                error = error or f"upstream response is not JSON: {raw[:200]!r}"
            if isinstance(body, dict):
                self._absorb_body(body)
                self.done = True
                if self.call.strips:
                    self._strip(body)
                    tail = _json.dumps(body)
        elif self._buf:
            tail = bytes(self._buf) if self.call.strips else b""
            self._buf.clear()
        if error is None and self.sse and not self.done and self._choices:
            error = "stream ended before [DONE]"
        return tail, self._steps(error or self._parse_error)

    def _steps(self, error: str | None) -> list[Step]:
        if not self._choices:
            return [error_step(self.call, error or "upstream response had no choices", top=self._top)]
        latency = time.perf_counter() - self.call.t0
        steps = []
        for i, c in sorted(self._choices.items()):
            try:
                steps.append(self._step(i, c, latency, error))
            except ValueError as exc:  # pydantic's ValidationError: a response we cannot make sense of
                steps.append(error_step(self.call, f"could not record choice {i}: {exc}", top=self._top))
        return steps

    def _step(self, index: int, c: _Choice, latency: float, error: str | None) -> Step:
        call, body = self.call, self.call.body
        prompt = _prompt_for(body.get("prompt"), index, int(body.get("n") or 1))
        tool_calls = [c.tool_calls[k] for k in sorted(c.tool_calls)] or None
        text = "".join(c.text) if c.text else (None if tool_calls else "")
        prompt_ids = c.prompt_token_ids if c.prompt_token_ids is not None else self._top.get("prompt_token_ids")
        ids, lps = c.token_ids, c.logprobs
        metadata: dict[str, Any] = {"upstream": call.upstream, "response_id": self._top.get("id")}
        if lps is not None and (ids is None or len(lps) != len(ids)):
            metadata["server_logprobs"] = lps  # kept for inspection, never trained on
            if c.logprob_tokens is not None and len(c.logprob_tokens) == len(lps):
                metadata["server_logprob_tokens"] = c.logprob_tokens
            lps = None
        source: TokenSource = "server" if prompt_ids is not None and ids is not None else "none"
        step = Step(
            agent=call.agent, endpoint=call.endpoint, model=body.get("model") or self._top.get("model"),
            messages=body.get("messages") if call.endpoint == "chat" else None,
            prompt=prompt if call.endpoint == "completions" else None,
            params=call.params, prompt_token_ids=prompt_ids, completion_token_ids=ids, logprobs=lps,
            text=text, tool_calls=tool_calls, finish_reason=c.finish_reason, usage=self._top.get("usage"),
            latency_s=latency, started_at=call.started_at, policy_version=_int_or_none(self._top.get("policy_version")),
            token_source=source, choice_index=index, error=error, metadata=metadata,
        )
        return retokenize_step(step, self.tokenizer)


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _prompt_for(prompt: Any, index: int, n: int) -> str | list[int] | None:
    """The prompt of choice `index`: batched completions prompts give n choices per prompt, in order."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return prompt[min(index // max(n, 1), len(prompt) - 1)]
    return prompt


def error_step(call: CallRequest, error: str, top: dict[str, Any] | None = None) -> Step:
    """A Step for a call that produced no usable response (refused, timed out, upstream error)."""
    body, top = call.body, top or {}
    try:
        return _error_step(call, error, body, top)
    except ValueError:  # a request body whose messages/prompt do not fit a Step: keep the error, drop them
        return Step(endpoint=call.endpoint, agent=call.agent, error=error, started_at=call.started_at,
                    metadata={"upstream": call.upstream, "request": body})


def _error_step(call: CallRequest, error: str, body: dict[str, Any], top: dict[str, Any]) -> Step:
    return Step(
        agent=call.agent, endpoint=call.endpoint, model=body.get("model"),
        messages=body.get("messages") if call.endpoint == "chat" else None,
        prompt=_prompt_for(body.get("prompt"), 0, 1) if call.endpoint == "completions" else None,
        params=call.params, latency_s=time.perf_counter() - call.t0, started_at=call.started_at,
        policy_version=_int_or_none(top.get("policy_version")), error=error,
        metadata={"upstream": call.upstream, "response_id": top.get("id")},
    )
