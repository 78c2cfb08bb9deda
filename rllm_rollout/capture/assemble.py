"""The one parser/assembler of LLM responses, shared by the gateway and in-process capture.

`CallAssembler` is fed the response bytes as they arrive (a JSON body or an SSE stream) and returns the bytes
the client should see: unchanged, or with the fields we asked for on its behalf (logprobs, token_ids,
prompt_token_ids) removed. `finish()` turns what it saw into one Step per choice. Streams are assembled the
way vLLM sends them: prompt ids in the first chunk, token-id and logprob deltas after, tool-call argument
fragments merged by `tool_calls[i].index` (the per-choice accumulation is `choices.Choice`; the SSE framing,
which follows the spec rather than the happy path, is `sse`).

Capture never breaks a call. `feed` and `finish` never raise: an exception inside a hook (`_on_event`,
`_absorb_chunk`, `_absorb_body`, `_strip`, `_steps`, `_step`, `_is_final_event`, also a subclass's) turns the
rest of the call into a pure pass-through (the client gets the upstream's bytes exactly, from the event that
failed on), and its Steps carry `error="capture failed ..."`: untrainable, but with the text seen so far.
Even then each event's data is shown to `_is_final_event`, so `done` still turns True at the stream's last
event and the transports record the Step before the client sees it. Subclasses override the hooks, never
`feed` / `finish`, so they keep that guarantee.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from rllm_core.errors import CaptureError
from rllm_core.types import Step, TokenSource
from rllm_rollout.capture import _json
from rllm_rollout.capture.choices import Choice, choice_index, logprobs_of
from rllm_rollout.capture.messages_chat import messages_to_chat
from rllm_rollout.capture.request import CallRequest
from rllm_rollout.capture.responses_input import input_to_messages
from rllm_rollout.capture.retokenize import retokenize_step
from rllm_rollout.capture.sse import EventBuffer, data_of, event_lines, rebuild

__all__ = ["CallAssembler", "error_step", "request_messages"]

log = logging.getLogger("rllm.capture")


def _loads(payload: bytes) -> tuple[Any, bool]:
    """(value, whether the standard library had to read it): orjson refuses the NaN / Infinity that Python
    servers write for a -inf logprob (`json.dumps` allows them), so those are read, and rewritten, by `json`."""
    try:
        return _json.loads(payload), False
    except ValueError:
        return json.loads(payload), True


def _dumps(obj: Any, stdlib: bool) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() if stdlib else _json.dumps(obj)


class CallAssembler:
    """Parse one response into Steps while passing it on to the client; see the module docstring."""

    def __init__(self, call: CallRequest, *, sse: bool, tokenizer: Any = None) -> None:
        self.call = call
        self.sse = sse
        self.tokenizer = tokenizer
        self.done = False
        """True once the stream's last event (`_is_final_event`) or a whole JSON body has been seen: the
        transports then record the Step before handing the client that event."""
        self._in = EventBuffer()  # received, not yet handed on
        self._out = bytearray()  # bytes decided for the client, not yet returned (when rewriting)
        self._choices: dict[int, Choice] = {}
        self._top_fields: dict[str, Any] = {}
        self._parse_error: str | None = None
        self._failed: str | None = None  # the first hook exception: from then on the call passes through
        self._framing_broken = False
        self._chunks = 0
        self._warned_logprobs = False

    # ------------------------------------------------------------------ the safety net
    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = (f"capture failed ({type(exc).__name__}: {exc}); the rest of the response reached the "
                            "client unparsed, this Step is incomplete")
            log.warning("capture of a %s call to %s failed; passing the response through unparsed",
                        self.call.endpoint, self.call.upstream, exc_info=True)

    def _leftover(self) -> bytes:
        """Everything not yet handed to the client, as it came (after a failure, when rewriting)."""
        held = self._in.take()
        out = bytes(self._out) + held if self.call.strips else b""
        self._out.clear()
        return out

    # ------------------------------------------------------------------ feeding
    def feed(self, data: bytes) -> bytes:
        """Take the next bytes from upstream; return the bytes to pass to the client now. Never raises."""
        if self._framing_broken:
            return data
        try:
            self._in.push(data)
            if not self.sse:
                return b"" if self.call.strips else data
            self._drain(final=False)
            if not self.call.strips:
                return data
            out = bytes(self._out)
            self._out.clear()
            return out
        except Exception as exc:  # the framing itself: hand over what is held and step aside for good
            self._fail(exc)
            self._framing_broken = True
            return self._leftover() if self.call.strips else data

    def _drain(self, final: bool) -> None:
        while (event := self._in.next_event(final)) is not None:
            out = event
            if self._failed is None:
                try:
                    out = self._on_event(event)
                except Exception as exc:  # that event goes out as it came, and so does everything after it
                    self._fail(exc)
                    out = event
            if self._failed is not None:  # passed through, but its end still seen: recorded before the client
                self._see_final(data_of(event_lines(event)))  # gets it (the failed event itself included)
            if self.call.strips:
                self._out += out

    def _see_final(self, payload: bytes | None) -> None:
        """`done` from `_is_final_event` in pass-through mode, where a raising hook must not stop the stream."""
        if self.done or payload is None:
            return
        try:
            self.done = bool(self._is_final_event(payload))
        except Exception as exc:
            self._fail(exc)

    def _is_final_event(self, payload: bytes) -> bool:
        """Whether an event with this data is the stream's last: the transports record the Step as soon as
        `done`, before the client gets that event, so a client that moves on at it finds its Step recorded.
        Chat and completions streams end with `[DONE]`. Shown the raw data of every event, parsed or passed
        through (after a hook failed), so an override must be cheap and must not rely on the other hooks."""
        return payload.strip() == b"[DONE]"

    def _on_event(self, event: bytes) -> bytes:
        lines = event_lines(event)
        payload = data_of(lines)
        if payload is None or not payload.strip():
            return event
        self.done = self.done or self._is_final_event(payload)
        if payload.strip() == b"[DONE]":  # not JSON
            return event
        try:
            chunk, stdlib = _loads(payload)
        except ValueError:
            self._parse_error = f"unparseable SSE event from upstream: {payload[:200]!r}"
            return event
        if not isinstance(chunk, dict):
            return event
        self._chunks += 1
        if chunk.get("error") and not chunk.get("choices"):  # vLLM reports mid-stream failures this way
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            self._parse_error = f"upstream error mid-stream: {msg}"
        self._absorb_chunk(chunk)
        if not self.call.strips:
            return event
        self._strip(chunk)
        return rebuild(lines, _dumps(chunk, stdlib))

    def _absorb_top(self, obj: dict[str, Any]) -> None:
        for key, kind in (("id", object), ("model", str), ("policy_version", object), ("prompt_token_ids", list),
                          ("usage", dict), ("system_fingerprint", object)):
            if obj.get(key) is not None and isinstance(obj[key], kind):
                self._top_fields[key] = obj[key]

    def _logprobs_requested(self) -> bool:
        """Whether the upstream was asked for logprobs (by the client, or by us on its behalf)."""
        asked = self.call.body.get("logprobs")
        return (asked is not None and asked is not False) or not self.call.wants_logprobs

    def _absorb_chunk(self, chunk: dict[str, Any]) -> None:
        self._absorb_top(chunk)
        choices = chunk.get("choices")
        for pos, ch in enumerate(choices if isinstance(choices, list) else []):
            if not isinstance(ch, dict):
                continue
            c = self._choices.setdefault(choice_index(ch, pos), Choice())
            delta = ch.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else ch.get("text")
            if isinstance(piece, str) and piece:  # ("" too would make a tool-call-only reply's text "", not None)
                c.text.append(piece)
            if isinstance(delta, dict):
                c.merge_tool_calls(delta.get("tool_calls"))
            self._absorb_tokens(c, ch, f"chunk {self._chunks}", chunk.get("policy_version"))

    def _absorb_body(self, body: dict[str, Any]) -> None:
        self._absorb_top(body)
        choices = body.get("choices")
        for pos, ch in enumerate(choices if isinstance(choices, list) else []):
            if not isinstance(ch, dict):
                continue
            c = self._choices[choice_index(ch, pos)] = Choice()
            msg = ch.get("message")
            if isinstance(msg, dict):
                if isinstance(msg.get("content"), str) and msg["content"]:
                    c.text.append(msg["content"])
                if isinstance(msg.get("tool_calls"), list):
                    c.tool_calls = dict(enumerate(t for t in msg["tool_calls"] if isinstance(t, dict)))
            elif isinstance(ch.get("text"), str):
                c.text.append(ch["text"])
            self._absorb_tokens(c, ch, "the body")

    def _absorb_tokens(self, c: Choice, ch: dict[str, Any], where: str, chunk_version: Any = None) -> None:
        """A choice's ids, logprobs, prompt ids, token versions and finish reason (the same in a chunk and in a
        body; a stream chunk's tokens take the chunk's `policy_version`)."""
        before = len(c.token_ids or [])
        c.add_tokens(ch.get("token_ids"), *logprobs_of(ch.get("logprobs")), where, self._logprobs_requested())
        c.add_versions(len(c.token_ids or []) - before, ch.get("token_policy_versions"), chunk_version)
        if isinstance(ch.get("prompt_token_ids"), list):
            c.prompt_token_ids = ch["prompt_token_ids"]
        if isinstance(ch.get("finish_reason"), str) and ch["finish_reason"]:
            c.finish_reason = ch["finish_reason"]

    def _strip(self, obj: dict[str, Any]) -> None:
        """Remove from a body/chunk (in place) what we asked for and the client did not."""
        if not self.call.wants_token_ids:
            obj.pop("prompt_token_ids", None)
        choices = obj.get("choices")
        for ch in choices if isinstance(choices, list) else []:
            if not isinstance(ch, dict):
                continue
            if not self.call.wants_logprobs:
                ch.pop("logprobs", None)
            if not self.call.wants_token_ids:
                ch.pop("token_ids", None)
                ch.pop("prompt_token_ids", None)
                ch.pop("token_policy_versions", None)

    # ------------------------------------------------------------------ finishing
    def finish(self, error: str | None = None) -> tuple[bytes, list[Step]]:
        """End of the response (or of our part in it): the last bytes for the client, and the Steps.

        Never raises; `error` (the transport's) wins over what went wrong here."""
        try:
            tail = self._finish_bytes()
        except Exception as exc:
            self._fail(exc)
            tail = self._leftover()
        early = "stream ended before [DONE]" if self.sse and not self.done and self._choices else None
        error = error or self._failed or early or self._parse_error
        try:
            steps = self._steps(error)
            if not isinstance(steps, list) or not all(isinstance(s, Step) for s in steps):
                raise TypeError(f"_steps returned {type(steps).__name__}, not a list of Steps")
        except Exception as exc:
            self._fail(exc)
            steps = self._fallback_steps(error or self._failed)
        return tail, steps

    def _finish_bytes(self) -> bytes:
        if self.sse:
            if not self._framing_broken:
                self._drain(final=True)
            return self._leftover()  # an unterminated last event: passed on, not parsed (nor will the client)
        raw = bytes(self._in.buf)  # left held until parsed: a failing hook hands it on as it came (`_leftover`)
        tail = raw if self.call.strips else b""
        try:
            body, stdlib = _loads(raw)
        except ValueError:
            body, stdlib = None, False
            self._parse_error = self._parse_error or f"upstream response is not JSON: {raw[:200]!r}"
        if isinstance(body, dict):
            self.done = True
            if self._failed is None:
                self._absorb_body(body)
                if self.call.strips:
                    self._strip(body)
                    tail = _dumps(body, stdlib)
        self._in.take()
        return tail

    def _fallback_steps(self, error: str | None, only: int | None = None) -> list[Step]:
        """One error Step per choice seen (or just choice `only`), with its text, when a real one failed."""
        msg = error or "capture failed"
        items = [(i, c) for i, c in sorted(self._choices.items()) if only is None or i == only] or [(0, None)]
        steps = []
        for i, c in items:
            text = "".join(t for t in c.text if isinstance(t, str)) if c is not None else None
            try:
                step = error_step(self.call, msg, top=self._top_fields)
                steps.append(step.model_copy(update={"choice_index": i, "text": text}))
            except Exception:
                steps.append(Step(error=msg, choice_index=i, text=text))
        return steps

    def _steps(self, error: str | None) -> list[Step]:
        if not self._choices:
            return [error_step(self.call, error or "upstream response had no choices", top=self._top_fields)]
        latency = time.perf_counter() - self.call.t0
        steps = []
        for i, c in sorted(self._choices.items()):
            try:
                steps.append(self._step(i, c, latency, error))
            except Exception as exc:  # pydantic's ValidationError, junk types: a choice we cannot make sense of
                steps.extend(self._fallback_steps(f"could not record choice {i}: {exc}", only=i))
        return steps

    def _step(self, index: int, c: Choice, latency: float, error: str | None) -> Step:
        call, body = self.call, self.call.body
        prompt = _prompt_for(body.get("prompt"), index, _int_or_none(body.get("n")) or 1)
        tool_calls = [c.tool_calls[k] for k in sorted(c.tool_calls)] or None
        text = "".join(c.text) if c.text else (None if tool_calls else "")
        top = self._top_fields
        prompt_ids = c.prompt_token_ids if c.prompt_token_ids is not None else top.get("prompt_token_ids")
        metadata: dict[str, Any] = {"upstream": call.upstream, "response_id": top.get("id")}
        lps = self._trainable_logprobs(c, metadata)
        source: TokenSource = "server" if prompt_ids is not None and c.token_ids is not None else "none"
        versions = c.token_versions if source == "server" else None
        if versions is None or None in versions or len(versions) != len(c.token_ids or []):
            versions = None  # only when the server said it for every token
        step = Step(
            agent=call.agent, endpoint=call.endpoint, model=body.get("model") or top.get("model"),
            messages=request_messages(call), prompt=prompt if call.endpoint == "completions" else None,
            params=call.params, prompt_token_ids=prompt_ids, completion_token_ids=c.token_ids, logprobs=lps,
            text=text, tool_calls=tool_calls, finish_reason=c.finish_reason, usage=top.get("usage"),
            latency_s=latency, started_at=call.started_at, policy_version=_int_or_none(top.get("policy_version")),
            token_policy_versions=versions, token_source=source, choice_index=index, error=error, metadata=metadata,
        )
        return retokenize_step(step, self.tokenizer)

    def _trainable_logprobs(self, c: Choice, metadata: dict[str, Any]) -> list[float] | None:
        """The choice's logprobs when they cover its token ids one by one; else None, with what the server did
        send kept in `metadata` (never trained on) and, where ids came without a logprob each,
        `metadata["logprobs_incomplete"]` saying where, and a warning (once per call)."""
        ids, lps = c.token_ids, c.logprobs
        if ids is not None and lps is not None and len(lps) == len(ids) and not c.gaps and None not in lps:
            return [float(x) for x in lps if x is not None]
        if lps is not None and any(x is not None for x in lps):
            if None in lps:
                metadata["server_logprobs_partial"] = lps  # None where the server gave no number
            else:
                metadata["server_logprobs"] = lps  # kept for inspection (and retokenizing), never trained on
                if c.logprob_tokens is not None and len(c.logprob_tokens) == len(lps):
                    metadata["server_logprob_tokens"] = c.logprob_tokens
        if ids is not None and (lps is not None or (ids and self._logprobs_requested())):
            gaps = c.gaps or [f"{len(ids)} token id(s) but {'no' if lps is None else len(lps)} logprob(s)"]
            more = c.gap_count - len(c.gaps)
            metadata["logprobs_incomplete"] = "; ".join(gaps) + (f"; and {more} more" if more > 0 else "")
            if not self._warned_logprobs:
                self._warned_logprobs = True
                log.warning("%s call to %s: the server's logprobs do not cover its token ids (%s); the Step "
                            "is kept without logprobs and will not be trained on", self.call.endpoint,
                            self.call.upstream, metadata["logprobs_incomplete"])
        return None


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def _prompt_for(prompt: Any, index: int, n: int) -> str | list[int] | None:
    """The prompt of choice `index`: batched completions prompts give n choices per prompt, in order."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return prompt[min(index // max(n, 1), len(prompt) - 1)]
    return prompt


def request_messages(call: CallRequest) -> list[dict[str, Any]] | None:
    """The call's prompt as chat messages, what a Step (errored ones too) keeps: chat's `messages`, a Responses
    call's `instructions` + `input` converted as for its recorded replies; None for completions (a `prompt`)."""
    if call.endpoint == "chat":
        return call.body.get("messages")
    if call.endpoint == "responses":
        return input_to_messages(call.body)
    if call.endpoint == "messages":
        if call.source is not None:  # the body is already the Chat translation
            return call.body.get("messages")
        try:
            return messages_to_chat(call.body)["messages"]
        except CaptureError:  # images, server tools: no Chat form; the Messages turns are kept as they came
            return [m for m in call.body.get("messages") or [] if isinstance(m, dict)] or None
    return None


def upstream_error(status: int, detail: str) -> str:
    """The error a Step records for an upstream's HTTP error answer (gateway and in-process capture alike)."""
    return f"upstream returned HTTP {status}: {detail}"


def upstream_status(error: str | None) -> int | None:
    """The HTTP status of an `upstream_error` text, or None for any other error."""
    m = re.match(r"upstream returned HTTP (\d{3})\b", error or "")
    return int(m.group(1)) if m else None


def error_step(call: CallRequest, error: str, top: dict[str, Any] | None = None) -> Step:
    """A Step for a call that produced no usable response (refused, timed out, upstream error), keeping its
    prompt (messages / prompt) so the failure can be looked at, and retried, from the record."""
    body, top = call.body, top or {}
    try:
        return _error_step(call, error, body, top)
    except ValueError:  # a request body whose messages/prompt do not fit a Step: keep the error, drop them
        return Step(endpoint=call.endpoint, agent=call.agent, error=error, started_at=call.started_at,
                    metadata={"upstream": call.upstream, "request": body})


def _error_step(call: CallRequest, error: str, body: dict[str, Any], top: dict[str, Any]) -> Step:
    return Step(
        agent=call.agent, endpoint=call.endpoint, model=body.get("model"),
        messages=request_messages(call),
        prompt=_prompt_for(body.get("prompt"), 0, 1) if call.endpoint == "completions" else None,
        params=call.params, latency_s=time.perf_counter() - call.t0, started_at=call.started_at,
        policy_version=_int_or_none(top.get("policy_version")), error=error,
        metadata={"upstream": call.upstream, "response_id": top.get("id")},
    )
