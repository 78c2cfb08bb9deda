"""OpenAI-shaped response bodies and SSE chunks, with vLLM's token-id fields and our `policy_version`.

Shapes follow what vLLM returns and what `rllm_testing.fake_upstream` (the gateway's contract) serves:
top-level `prompt_token_ids`, per-choice `token_ids` when `return_token_ids` was asked; chat logprobs as
`choices[i].logprobs.content[{token, logprob, bytes, top_logprobs}]`, completions logprobs as `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rllm_serve.sequence import TokenEvent

__all__ = ["ChoiceResult", "ResponseBuilder", "parse_tool_calls"]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ChoiceResult:
    """Everything one choice produced, gathered from its TokenEvents."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    policy_version: int = 0
    error: str | None = None
    token_versions: list[int] = field(default_factory=list)
    """The policy version that produced each token (two versions after a swap_mode="resume" weight swap)."""

    def add(self, ev: TokenEvent) -> None:
        if ev.token_id is not None:
            self.token_ids.append(ev.token_id)
            self.token_versions.append(ev.policy_version)
            self.logprobs.append(ev.logprob if ev.logprob is not None else 0.0)
            self.tops.append(ev.top_logprobs or [])
        self.text += ev.text
        self.policy_version = ev.policy_version
        if ev.finish_reason:
            self.finish_reason, self.error = ev.finish_reason, ev.error


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split Hermes-style `<tool_call>{"name":..., "arguments":...}</tool_call>` blocks (Qwen, SmolLM3) out of text."""
    calls = []
    for k, m in enumerate(_TOOL_CALL.finditer(text)):
        try:
            obj = json.loads(m.group(1))
            args = obj.get("arguments", obj.get("parameters", {}))
            calls.append({"id": f"call_{uuid.uuid4().hex[:12]}_{k}", "type": "function",
                          "function": {"name": str(obj["name"]),
                                       "arguments": args if isinstance(args, str) else json.dumps(args)}})
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    if not calls:
        return text, []
    content = text[: text.find("<tool_call>")].strip()
    return content or None, calls


class ResponseBuilder:
    """Builds the bodies of one request; `chat` selects chat.completion vs text_completion shapes."""

    def __init__(self, tokenizer: Any, model: str, chat: bool, prompt_ids: list[int], want_ids: bool,
                 want_logprobs: bool, parse_tools: bool = False) -> None:
        self.tokenizer, self.model, self.chat = tokenizer, model, chat
        self.prompt_ids, self.want_ids, self.want_logprobs = prompt_ids, want_ids, want_logprobs
        self.parse_tools = parse_tools
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._token_str = lru_cache(maxsize=65536)(self._decode_one)

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    # ------------------------------------------------------------------ logprobs
    def _chat_lp_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
        s = self._token_str(token_id)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8")),
                "top_logprobs": [{"token": self._token_str(t), "logprob": lp,
                                  "bytes": list(self._token_str(t).encode("utf-8"))} for t, lp in top]}

    def chat_logprobs(self, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> dict[str, Any]:
        return {"content": [self._chat_lp_entry(t, lp, top) for t, lp, top in zip(ids, lps, tops, strict=True)]}

    def completion_logprobs(self, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]],
                            offset: int = 0) -> dict[str, Any]:
        tokens = [self._token_str(t) for t in ids]
        offsets, pos = [], offset
        for s in tokens:
            offsets.append(pos)
            pos += len(s)
        has_top = any(tops)
        return {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets,
                "top_logprobs": [{self._token_str(t): lp for t, lp in top} for top in tops] if has_top else None}

    # ------------------------------------------------------------------ whole responses
    def usage(self, completion_tokens: int) -> dict[str, int]:
        p = len(self.prompt_ids)
        return {"prompt_tokens": p, "completion_tokens": completion_tokens, "total_tokens": p + completion_tokens}

    def full(self, results: list[ChoiceResult]) -> dict[str, Any]:
        choices = []
        for r in results:
            ch: dict[str, Any] = {"index": r.index, "finish_reason": r.finish_reason}
            if self.chat:
                content, calls = parse_tool_calls(r.text) if self.parse_tools else (r.text, [])
                msg: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    msg["tool_calls"] = calls
                    ch["finish_reason"] = "tool_calls"
                ch["message"] = msg
                ch["logprobs"] = self.chat_logprobs(r.token_ids, r.logprobs, r.tops) if self.want_logprobs else None
            else:
                ch["text"] = r.text
                ch["logprobs"] = (self.completion_logprobs(r.token_ids, r.logprobs, r.tops)
                                  if self.want_logprobs else None)
            if self.want_ids:
                ch["token_ids"] = r.token_ids
                ch["token_policy_versions"] = r.token_versions
            choices.append(ch)
        out: dict[str, Any] = {
            "id": self.id, "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created, "model": self.model, "choices": choices,
            "usage": self.usage(sum(len(r.token_ids) for r in results)),
            "policy_version": results[0].policy_version if results else 0,
        }
        if self.want_ids:
            out["prompt_token_ids"] = self.prompt_ids
        return out

    # ------------------------------------------------------------------ streaming
    def _chunk(self, choices: list[dict[str, Any]], policy_version: int, **extra: Any) -> bytes:
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "policy_version": policy_version, **extra}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    def first_chunk(self, n: int, policy_version: int) -> bytes | None:
        """Role deltas (chat) and the prompt ids (when asked); None when there is nothing to say yet."""
        extra = {"prompt_token_ids": self.prompt_ids} if self.want_ids else {}
        if self.chat:
            choices = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None} for i in range(n)]
            return self._chunk(choices, policy_version, **extra)
        return self._chunk([], policy_version, **extra) if self.want_ids else None

    def token_chunk(self, ev: TokenEvent) -> bytes:
        ch: dict[str, Any] = {"index": ev.choice, "finish_reason": None}
        ids = [ev.token_id] if ev.token_id is not None else []
        lps = [ev.logprob if ev.logprob is not None else 0.0] if ids else []
        tops = [ev.top_logprobs or []] if ids else []
        if self.chat:
            ch["delta"] = {"content": ev.text}
            ch["logprobs"] = self.chat_logprobs(ids, lps, tops) if self.want_logprobs else None
        else:
            ch["text"] = ev.text
            ch["logprobs"] = self.completion_logprobs(ids, lps, tops) if self.want_logprobs else None
        if self.want_ids:
            ch["token_ids"] = ids
        return self._chunk([ch], ev.policy_version)

    def whole_chunks(self, r: ChoiceResult) -> bytes:
        """A finished choice as one delta (text and parsed tool calls, every id and logprob), then its finish
        chunk: how a reply with tools is streamed (the text must be whole to be parsed)."""
        if r.finish_reason in ("error", "abort"):
            return self.error_chunk(f"generation failed: {r.error}")
        content, calls = parse_tool_calls(r.text) if self.parse_tools else (r.text, [])
        delta: dict[str, Any] = {"content": content or ""}
        if calls:
            delta["tool_calls"] = [{**c, "index": k} for k, c in enumerate(calls)]
        ch: dict[str, Any] = {"index": r.index, "finish_reason": None, "delta": delta,
                              "logprobs": self.chat_logprobs(r.token_ids, r.logprobs, r.tops)
                              if self.want_logprobs else None}
        if self.want_ids:
            ch["token_ids"] = r.token_ids
            ch["token_policy_versions"] = r.token_versions
        finish = "tool_calls" if calls and r.finish_reason == "stop" else str(r.finish_reason)
        return self._chunk([ch], r.policy_version) + self.finish_chunk(r.index, finish, r.policy_version)

    def finish_chunk(self, choice: int, finish_reason: str, policy_version: int) -> bytes:
        ch: dict[str, Any] = {"index": choice, "finish_reason": finish_reason}
        if self.chat:
            ch["delta"] = {}
        else:
            ch["text"] = ""
        return self._chunk([ch], policy_version)

    def usage_chunk(self, completion_tokens: int, policy_version: int) -> bytes:
        return self._chunk([], policy_version, usage=self.usage(completion_tokens))

    @staticmethod
    def error_chunk(message: str) -> bytes:
        return b"data: " + json.dumps({"error": {"message": message, "type": "server_error"}}).encode() + b"\n\n"
