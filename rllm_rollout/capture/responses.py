"""The OpenAI Responses API (`POST .../responses`) captured like a chat call.

`ResponsesAssembler` is a `CallAssembler` over the Responses wire: a JSON body (`output` items) or an SSE
stream of typed events (`response.created`, `response.output_text.delta` ... `response.completed`). That
stream has no `[DONE]`: it ends with `response.completed` / `response.incomplete` / `response.failed`, so
`_is_final_event` says so there and both transports record the Step before the client sees that event (also
after a hook failed and the rest of the stream is passed through unparsed).

The Step is chat-shaped so packing and training treat it like any chat call: `messages` is the request's
`instructions` + `input` converted to chat messages (`input_to_messages`), `text` the output text,
`tool_calls` the `function_call` items as chat tool calls, `reasoning` items kept in `metadata["reasoning"]`.
Token ids come from vLLM's `enable_response_messages` (`input_messages` / `output_messages` of type
`raw_message_tokens`), logprobs from `output_text.logprobs` (or, from rllm's policy server, per-token
`logprobs` beside the output tokens, which also cover tool-call tokens); `usage` keeps the Responses
counts and adds the chat names (`prompt_tokens`, `completion_tokens`) the engine sums.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from rllm_core.types import Step, TokenSource
from rllm_rollout.capture import _json
from rllm_rollout.capture.assemble import CallAssembler, error_step
from rllm_rollout.capture.request import CallRequest
from rllm_rollout.capture.responses_input import chat_tools, input_to_messages, tool_call_of
from rllm_rollout.capture.retokenize import retokenize_step

__all__ = ["ResponsesAssembler", "usage_with_chat_names"]

_TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
_TERMINAL_BYTES = tuple(t.encode() for t in _TERMINAL)
_TEXT_EVENTS = {"response.output_text.delta", "response.output_text.done"}
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


# ---------------------------------------------------------------------------------- the assembler
class ResponsesAssembler(CallAssembler):
    """Parse one Responses API reply (JSON or SSE) into one Step; see the module docstring."""

    def __init__(self, call: CallRequest, *, sse: bool, tokenizer: Any = None) -> None:
        super().__init__(call, sse=sse, tokenizer=tokenizer)
        self._response: dict[str, Any] | None = None
        """The latest whole response object seen (the body, or a created/completed event's)."""
        self._items: dict[int, dict[str, Any]] = {}
        self._texts: dict[int, list[str]] = {}
        self._args: dict[int, list[str]] = {}
        self._stream_lps: list[dict[str, Any]] = []
        self._failure: str | None = None

    # ------------------------------------------------------------------ hooks: absorbing
    def _is_final_event(self, payload: bytes) -> bool:
        """A terminal event (the stream has no `[DONE]`; one is still honoured). Only data naming a terminal
        type is parsed, so the many delta events cost a substring search, in pass-through mode too."""
        if super()._is_final_event(payload):
            return True
        if not any(t in payload for t in _TERMINAL_BYTES):
            return False
        try:
            event = _json.loads(payload)
        except ValueError:
            try:
                event = json.loads(payload)  # NaN / Infinity, which orjson refuses
            except ValueError:
                return False
        return isinstance(event, dict) and _kind(event) in _TERMINAL

    def _absorb_chunk(self, chunk: dict[str, Any]) -> None:
        kind = chunk.get("type")
        idx = chunk.get("output_index")
        idx = idx if isinstance(idx, int) else 0
        if isinstance(chunk.get("response"), dict):
            self._response = self._keep(chunk["response"])
        if kind in ("response.output_item.added", "response.output_item.done"):
            if isinstance(chunk.get("item"), dict):
                self._items[idx] = self._keep(chunk["item"])
        elif kind == "response.output_text.delta":
            self._texts.setdefault(idx, []).append(str(chunk.get("delta") or ""))
            lps = chunk.get("logprobs")
            if isinstance(lps, list):
                self._stream_lps.extend(e for e in lps if isinstance(e, dict))
        elif kind == "response.function_call_arguments.delta":
            self._args.setdefault(idx, []).append(str(chunk.get("delta") or ""))
        elif kind == "response.function_call_arguments.done" and isinstance(chunk.get("arguments"), str):
            self._args[idx] = [chunk["arguments"]]
        elif kind == "error":
            self._failure = f"upstream error mid-stream: {chunk.get('message') or chunk.get('code') or chunk}"

    def _absorb_body(self, body: dict[str, Any]) -> None:
        self._response = self._keep(body)

    def _keep(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What we read later, safe from `_strip` (which rewrites the client's copy in place right after)."""
        return copy.deepcopy(obj) if self.call.strips else obj

    # ------------------------------------------------------------------ hooks: stripping
    def _strip(self, obj: dict[str, Any]) -> None:
        """Put back what the server says when not asked: delta logprobs `[]`, the rest `null`, in place."""
        if not self.call.wants_logprobs and _kind(obj) in _TEXT_EVENTS and "logprobs" in obj:
            obj["logprobs"] = []
        if isinstance(obj.get("response"), dict):
            self._strip_response(obj["response"])
        if isinstance(obj.get("item"), dict):
            self._strip_item(obj["item"])
        if isinstance(obj.get("part"), dict):
            self._strip_part(obj["part"])
        if "output" in obj:  # a whole (non-streamed) response body
            self._strip_response(obj)

    def _strip_response(self, r: dict[str, Any]) -> None:
        if not self.call.wants_token_ids:
            for key in ("input_messages", "output_messages"):
                if key in r:
                    r[key] = None
        if not self.call.wants_logprobs:
            if "top_logprobs" in r:
                r["top_logprobs"] = None  # vLLM echoes its logprobs setting, null when none were asked
            for item in _list(r.get("output")):
                if isinstance(item, dict):
                    self._strip_item(item)

    def _strip_item(self, item: dict[str, Any]) -> None:
        for part in _list(item.get("content")) if item.get("type") == "message" else []:
            if isinstance(part, dict):
                self._strip_part(part)

    def _strip_part(self, part: dict[str, Any]) -> None:
        if not self.call.wants_logprobs and part.get("type") == "output_text" and "logprobs" in part:
            part["logprobs"] = None

    # ------------------------------------------------------------------ hooks: the Step
    def _top_info(self) -> dict[str, Any]:
        r = self._response or {}
        return {"id": r.get("id"), "policy_version": r.get("policy_version")}

    def _steps(self, error: str | None) -> list[Step]:
        if error is None and self.sse and not self.done:
            error = self._failure or (
                "stream ended before response.completed" if self._response or self._items else None)
        error = error or self._failure
        if self._response is None and not self._items:
            return [error_step(self.call, error or "upstream response had no output", top=self._top_info())]
        try:
            return [self._response_step(error)]
        except Exception as exc:
            return [error_step(self.call, f"could not record the response: {type(exc).__name__}: {exc}",
                               top=self._top_info())]

    def _streamed_output(self) -> list[dict[str, Any]]:
        """The output items rebuilt from stream events (a stream cut before its final response)."""
        out = []
        for idx in sorted(set(self._items) | set(self._texts) | set(self._args)):
            item = dict(self._items.get(idx) or {"type": "message" if idx in self._texts else "function_call"})
            if item.get("type") == "message" and idx in self._texts and not item.get("content"):
                item["content"] = [{"type": "output_text", "text": "".join(self._texts[idx])}]
            if item.get("type") == "function_call" and idx in self._args and not item.get("arguments"):
                item["arguments"] = "".join(self._args[idx])
            out.append(item)
        return out

    def _response_step(self, error: str | None) -> Step:
        call, body = self.call, self.call.body
        resp = self._response or {}
        output = _list(resp.get("output")) or self._streamed_output()
        text: list[str] = []
        entries: list[dict[str, Any]] = []
        missing_lps = False
        tool_calls: list[dict[str, Any]] = []
        reasoning: list[dict[str, Any]] = []
        other: list[dict[str, Any]] = []
        for item in output:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "message":
                for part in _list(item.get("content")):
                    if isinstance(part, dict) and part.get("type") == "output_text":
                        text.append(str(part.get("text") or ""))
                        lps = part.get("logprobs")
                        missing_lps |= not lps and bool(part.get("text"))
                        entries.extend(e for e in _list(lps) if isinstance(e, dict))
            elif kind == "function_call":
                tool_calls.append(tool_call_of(item))
            elif kind == "reasoning":
                reasoning.append(item)
            else:
                other.append(item)
        if (missing_lps or not entries) and self._stream_lps:
            entries = self._stream_lps  # a final response without logprobs: the deltas had them
        prompt_ids, ids, raw_lps = _raw_tokens(resp)
        values = [_number(e.get("logprob")) for e in entries]
        lps: list[float] | None = [v for v in values if v is not None] if entries else None
        lp_tokens = [str(e.get("token", "")) for e in entries] if entries else None
        metadata: dict[str, Any] = {"upstream": call.upstream, "response_id": resp.get("id")}
        raw = [_number(v) for v in raw_lps] if raw_lps is not None else None
        if raw is not None and ids is not None and len(raw) == len(ids) and None not in raw:
            lps, lp_tokens, values = [v for v in raw if v is not None], None, raw  # rllm's server: one per token
        if lps is not None and len(lps) != len(values):  # never silently: the Step says why it is untrainable
            metadata["logprobs_incomplete"] = f"{len(values) - len(lps)} logprob(s) missing or not numbers"
            metadata["server_logprobs_partial"] = values
            lps = None
        if reasoning:
            metadata["reasoning"] = reasoning
        if other:
            metadata["other_output"] = other
        if body.get("previous_response_id"):
            metadata["previous_response_id"] = body["previous_response_id"]  # earlier turns are not in messages
        if lps is not None and (ids is None or len(lps) != len(ids)):
            metadata["server_logprobs"] = lps  # kept for inspection (and retokenizing), never trained on as is
            if lp_tokens is not None and len(lp_tokens) == len(lps):
                metadata["server_logprob_tokens"] = lp_tokens
            lps = None
        finish, error = _finish(resp, bool(tool_calls), error)
        source: TokenSource = "server" if prompt_ids is not None and ids is not None else "none"
        step = Step(
            agent=call.agent, endpoint="responses", model=body.get("model") or resp.get("model"),
            messages=input_to_messages(body), params=call.params, prompt_token_ids=prompt_ids,
            completion_token_ids=ids, logprobs=lps, text="".join(text) if text else (None if tool_calls else ""),
            tool_calls=tool_calls or None, finish_reason=finish, usage=usage_with_chat_names(resp.get("usage")),
            latency_s=time.perf_counter() - call.t0, started_at=call.started_at,
            policy_version=_int_or_none(resp.get("policy_version")), token_source=source, error=error,
            metadata=metadata,
        )
        if step.token_source != "none" or self.tokenizer is None:
            return step
        # retokenize as the chat call it is: chat-shaped tools for the template, the endpoint put back after
        chat = step.model_copy(update={"endpoint": "chat", "params": {**step.params,
                                                                      "tools": chat_tools(body.get("tools"))}})
        return retokenize_step(chat, self.tokenizer).model_copy(update={"endpoint": "responses",
                                                                         "params": step.params})


def _raw_tokens(resp: dict[str, Any]) -> tuple[list[int] | None, list[int] | None, list[Any] | None]:
    """(prompt ids, completion ids, per-token logprobs) from vLLM's `raw_message_tokens` messages."""

    def one(msgs: Any) -> dict[str, Any] | None:
        if isinstance(msgs, list) and len(msgs) == 1 and isinstance(msgs[0], dict) \
                and msgs[0].get("type") == "raw_message_tokens" and isinstance(msgs[0].get("tokens"), list):
            return msgs[0]
        return None  # absent, or several turns (built-in tools ran server-side): no single prompt/completion

    inp, out = one(resp.get("input_messages")), one(resp.get("output_messages"))
    if inp is None or out is None:
        return None, None, None
    lps = out.get("logprobs")
    try:
        return ([int(t) for t in inp["tokens"]], [int(t) for t in out["tokens"]],
                lps if isinstance(lps, list) else None)
    except (TypeError, ValueError, OverflowError):  # ids that are not integers: no server ids (retokenized if it can)
        return None, None, None


def _finish(resp: dict[str, Any], tool_calls: bool, error: str | None) -> tuple[str | None, str | None]:
    status = resp.get("status")
    if status == "completed":
        return ("tool_calls" if tool_calls else "stop"), error
    if status == "incomplete":
        reason = _dict(resp.get("incomplete_details")).get("reason")
        return _INCOMPLETE.get(str(reason), str(reason or "length")), error
    if status == "failed":
        err = resp.get("error") or {}
        msg = err.get("message", err) if isinstance(err, dict) else err
        return "error", error or f"upstream response failed: {json.dumps(msg) if not isinstance(msg, str) else msg}"
    if status == "cancelled":
        return "abort", error
    return None, error


def usage_with_chat_names(u: Any) -> dict[str, Any] | None:
    """A Responses or Messages usage, plus the chat names for its counts (what token accounting reads)."""
    if not isinstance(u, dict):
        return None
    out = dict(u)
    if "input_tokens" in u:
        out.setdefault("prompt_tokens", u["input_tokens"])
    if "output_tokens" in u:
        out.setdefault("completion_tokens", u["output_tokens"])
    return out


def _kind(obj: dict[str, Any]) -> str | None:
    """An event's or item's `type`, when it is a string (junk such as a list must not reach a set lookup)."""
    kind = obj.get("type")
    return kind if isinstance(kind, str) else None


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError, OverflowError):
        return None
