"""One chat call over any OpenAI-compatible endpoint, with the rollout's sampling defaults applied.

Workflows and default rollouts all go through the `openai` SDK pointed at `config.base_url` (the episode's
gateway session), so every call is recorded with the server's token ids whatever the upstream is.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from rllm_core.context import AGENT_HEADER, current_agent
from rllm_core.types import Task
from rllm_rollout.rollout import RolloutConfig

__all__ = ["AGENT_HEADER", "ChatReply", "chat", "make_client", "task_messages", "task_text"]


_SDK_PARAMS = {"temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "seed", "stop",
               "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs"}


class ChatReply:
    """The text of one choice plus why it ended (finish_reason "length" marks a truncated answer)."""

    __slots__ = ("finish_reason", "text")

    def __init__(self, text: str, finish_reason: str | None) -> None:
        self.text = text
        self.finish_reason = finish_reason

    def __repr__(self) -> str:
        return f"ChatReply({self.text!r}, finish_reason={self.finish_reason!r})"


def task_messages(task: Task) -> list[dict[str, Any]]:
    """The task's instruction as chat messages (an instruction may already be a message list)."""
    if isinstance(task.instruction, list):
        return [dict(m) for m in task.instruction]
    return [{"role": "user", "content": str(task.instruction)}]


def task_text(task: Task) -> str:
    """The task as plain text, for prompts that quote it to another agent (judge, critic, moderator): a
    message-list instruction becomes its messages' text, one per line."""
    if isinstance(task.instruction, list):
        return "\n\n".join(str(m.get("content") or "") for m in task.instruction if m.get("role") != "system")
    return str(task.instruction)


def make_client(config: RolloutConfig) -> AsyncOpenAI:
    """An AsyncOpenAI client on this episode's session URL; no SDK retries, so each recorded call is real."""
    timeout = float(getattr(config, "request_timeout_s", 600.0) or 600.0)
    return AsyncOpenAI(base_url=config.base_url, api_key=config.api_key or "EMPTY", max_retries=0, timeout=timeout)


def _split_params(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    sdk = {k: v for k, v in params.items() if k in _SDK_PARAMS and v is not None}
    extra = {k: v for k, v in params.items() if k not in _SDK_PARAMS and v is not None}
    return sdk, extra


async def chat(client: AsyncOpenAI, config: RolloutConfig, messages: list[dict[str, Any]],
               **overrides: Any) -> ChatReply:
    """One chat completion with `config.sampling` overlaid by `overrides`; returns the first choice."""
    sdk, extra = _split_params({**config.sampling, **overrides})
    agent = current_agent()  # also added by in-process capture; explicit here so any transport attributes it
    resp = await client.chat.completions.create(
        model=config.model, messages=messages, extra_body=extra or None,  # type: ignore[arg-type]
        extra_headers={AGENT_HEADER: agent} if agent else None, **sdk,
    )
    choice = resp.choices[0]
    return ChatReply(choice.message.content or "", choice.finish_reason)
