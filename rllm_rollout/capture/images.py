"""Image parts of the three APIs an agent calls (Chat Completions, Responses, Anthropic Messages), read alike.

The policy server renders them for a vision-language model (rllm_serve/vision.py) and packing gives a training
row the images its prompt showed (rllm_train/packing.py), so both read a part's image the same way; this module is
pure data handling (no torch, no PIL), importable wherever a Step's messages are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["hf_messages", "image_source", "message_images"]


def image_source(part: Any) -> str | None:
    """The image a content part carries, as a URL (data: or http(s):), for the three APIs' shapes; None for a
    part that is no image."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "image_url":  # Chat Completions: {"image_url": {"url": ...}} (or a bare string)
        value = part.get("image_url")
        return str(value.get("url", "")) if isinstance(value, dict) else str(value or "")
    if kind == "input_image":  # Responses
        value = part.get("image_url")
        return str(value.get("url", "")) if isinstance(value, dict) else str(value or "")
    if kind == "image":  # Anthropic: {"source": {"type": "base64", "media_type", "data"} | {"type": "url", "url"}}
        src = part.get("source") or {}
        if src.get("type") == "base64":
            return f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
        return str(src.get("url", ""))
    return None


def hf_messages(messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages with content parts in transformers' form (`{"type": "image"}`, `{"type": "text"}`), and
    the image sources in the order their markers appear."""
    out: list[dict[str, Any]] = []
    sources: list[str] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(dict(message))
            continue
        parts: list[dict[str, Any]] = []
        for part in content:
            src = image_source(part)
            if src is not None:
                sources.append(src)
                parts.append({"type": "image"})
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
        out.append({**message, "content": parts})
    return out, sources


def message_images(messages: Sequence[dict[str, Any]] | None) -> list[str]:
    """The image sources of `messages`, in the order a chat template shows them."""
    return hf_messages(messages or [])[1]
