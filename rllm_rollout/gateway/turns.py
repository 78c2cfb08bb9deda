"""Per-session memory of the last turns, so the next chat call of a multi-turn agent can continue token-exactly.

For upstreams with `exact_turns` (rllm's policy server; see
`rllm_serve.continuation`), a chat request whose messages start with an earlier call's
messages plus that call's reply gets `rllm_continue = {"token_ids": its prompt + completion ids, "messages": k}`:
the server then builds the prompt from those exact tokens instead of re-rendering and re-tokenizing the history.
The reply is matched loosely where agents commonly rewrite it (surrounding or repeated whitespace, content as a
list of text parts) and strictly everywhere else (roles, tool calls, earlier messages), so a history the agent
really changed is never continued.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from rllm_core.types import Step

__all__ = ["TurnTracker"]

_MAX_SESSIONS = 50_000
_TURNS_PER_SESSION = 8
"""Recent turns kept per session: several agents (or tools calls in parallel) may share one session."""


@dataclass(frozen=True)
class _Turn:
    messages: tuple[str, ...]
    """The call's messages plus its reply, each normalised."""
    token_ids: tuple[int, ...]


def _text(content: Any) -> str:
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return " ".join(str(content or "").split())


def _tool_calls(calls: Any) -> list[tuple[str, Any]]:
    out = []
    for call in calls or []:
        fn = (call or {}).get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        out.append((str(fn.get("name")), args))
    return out


def _normal(message: dict[str, Any]) -> str:
    """A message as the key it is compared by (whitespace-insensitive content, parsed tool-call arguments)."""
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    return json.dumps({"role": message.get("role"), "content": _text(message.get("content")),
                       "tool_calls": _tool_calls(message.get("tool_calls")),
                       "tool_call_id": message.get("tool_call_id"), "name": message.get("name")},
                      sort_keys=True, default=str)


class TurnTracker:
    """Remembers each session's recent chat turns (from recorded Steps) and offers the continuation hint."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, deque[_Turn]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, session_id: str, steps: list[Step]) -> None:
        for step in steps:
            if (step.endpoint not in ("chat", "messages") or step.error is not None or step.choice_index != 0
                    or not step.messages or step.prompt_token_ids is None or not step.completion_token_ids
                    or step.token_source != "server"):
                continue
            reply = {"role": "assistant", "content": step.text or "", "tool_calls": step.tool_calls}
            turn = _Turn(tuple(_normal(m) for m in [*step.messages, reply]),
                         tuple(step.prompt_token_ids) + tuple(step.completion_token_ids))
            with self._lock:
                turns = self._sessions.setdefault(session_id, deque(maxlen=_TURNS_PER_SESSION))
                self._sessions.move_to_end(session_id)
                turns.append(turn)
                if len(self._sessions) > _MAX_SESSIONS:
                    self._sessions.popitem(last=False)

    def hint(self, session_id: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """`rllm_continue` for this chat request body, or None (no earlier turn it extends, n > 1, ...)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or (body.get("n") or 1) != 1:
            return None
        with self._lock:
            turns = list(self._sessions.get(session_id) or ())
        if not turns:
            return None
        normal = [_normal(m) for m in messages]
        best: _Turn | None = None
        for turn in turns:
            k = len(turn.messages)
            if k < len(normal) and tuple(normal[:k]) == turn.messages and (best is None or k > len(best.messages)):
                best = turn
        if best is None:
            return None
        return {"token_ids": list(best.token_ids), "messages": len(best.messages)}

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)
