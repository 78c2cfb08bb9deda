"""The request side of the OpenAI Responses API as the chat call it is: `instructions` + `input` items as chat
messages, function tools in chat's shape. What capture records for a Responses call (assemble.py, responses.py)
and what the policy server renders (rllm_serve) are the same conversion, from here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["chat_tools", "input_to_messages", "tool_call_of"]


def _text_of(content: Any) -> Any:
    """Responses content (a string or typed parts) as chat content: a string when it is all text."""
    if not isinstance(content, list):
        return "" if content is None else content
    parts: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind in ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"):
            parts.append({"type": "text", "text": p.get("text", p.get("refusal", ""))})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": p.get("image_url") or p.get("file_id") or ""}})
        else:
            parts.append(p)
    if all(p.get("type") == "text" for p in parts):
        return "".join(str(p.get("text") or "") for p in parts)
    return parts


def tool_call_of(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": item.get("call_id") or item.get("id"), "type": "function",
            "function": {"name": item.get("name") or "", "arguments": item.get("arguments") or ""}}


def input_to_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's `instructions` and `input` as chat messages (what a chat template renders).

    A string input is one user message; `instructions` becomes a system message first; `developer` becomes
    `system` (what chat templates know); `function_call` items join the assistant message before them as
    `tool_calls`; `function_call_output` items become `tool` messages. Reasoning and built-in tool items
    have no chat form and are left out (the policy server renders exactly these messages).
    """
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role") or "user"
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if last is None or last.get("role") != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(tool_call_of(item))
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _text_of(item.get("output"))})
    return messages


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses function tools (flat `{"type": "function", "name": ...}`) in chat's nested shape."""
    out = []
    for t in tools if isinstance(tools, list) else []:
        if isinstance(t, dict) and t.get("type") == "function":
            fn = t.get("function") if isinstance(t.get("function"), dict) else t  # already nested: keep it
            out.append({"type": "function", "function": {
                k: fn[k] for k in ("name", "description", "parameters", "strict") if fn.get(k) is not None}})
    return out or None
