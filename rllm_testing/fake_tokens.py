"""The fake upstream's tokens: UTF-8 bytes offset by 3 (exact and checkable), logprobs a fixed function of the id."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["decode", "encode", "token_logprob"]


def encode(text: str) -> list[int]:
    return [b + 3 for b in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")


def token_logprob(token_id: int) -> float:
    return -round(((token_id * 7919) % 1000) / 1000 + 0.01, 6)


def _token_str(token_id: int) -> str:
    return bytes([token_id - 3]).decode("latin-1")


def _prompt_ids(body: dict[str, Any]) -> list[int]:
    if "input" in body:  # the Responses API: instructions and input, as sent
        return encode(json.dumps([body.get("instructions"), body["input"]], sort_keys=True, separators=(",", ":")))
    if "messages" in body:
        return encode(json.dumps(body["messages"], sort_keys=True, separators=(",", ":")))
    prompt = body.get("prompt", "")
    return list(prompt) if isinstance(prompt, list) else encode(str(prompt))
