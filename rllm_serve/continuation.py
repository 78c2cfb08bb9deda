"""Token-exact multi-turn prompts: the previous turn's own tokens, then the template tokens of the new messages.

Re-rendering a conversation through the chat template and re-tokenizing it does not always give back the tokens
that were sampled (non-canonical BPE merges drawn at temperature 1, whitespace an agent stripped, templates that
drop reasoning). Then the next turn's prompt does not start with the previous prompt + completion, packing must
start a new row holding the whole history, and training sees other tokens than sampling did.

The gateway (for upstreams with `exact_turns`) sends `rllm_continue = {"token_ids": prev prompt + completion,
"messages": k}` with a chat request whose first k messages are the previous turn's messages plus its reply. The
prompt is then `token_ids + tail + suffix`: `suffix` is what the template adds for messages[k:] (the render of
all messages minus the render of the first k, when the latter is a prefix of the former), `tail` the template
tokens after the previous reply's end-of-turn token (SmolLM2/ChatML: the newline after `<|im_end|>`; a reply cut
by max_tokens gets `<|im_end|>` too). Anything that does not line up exactly (the first k messages do not render as
a prefix of all of them, no end-of-turn token in the template) falls back to the plain render: a prompt is never
invented.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ContinueHint", "continued_prompt"]


class ContinueHint(BaseModel):
    """The gateway's hint: the exact tokens of the conversation so far and how many messages they cover."""

    model_config = ConfigDict(extra="forbid")

    token_ids: list[int] = Field(min_length=1)
    messages: int = Field(ge=1)


def continued_prompt(hint: ContinueHint, messages: Sequence[dict[str, Any]],
                     render: Callable[[Sequence[dict[str, Any]], bool], list[int]],
                     end_of_turn: frozenset[int]) -> list[int] | None:
    """The exact prompt for `messages` continuing `hint`, or None when it cannot be built exactly.

    `render(messages, add_generation_prompt)` is the server's own template + tokenizer."""
    k = hint.messages
    if k >= len(messages):
        return None
    full = render(messages, True)
    base = render(messages[:k], False)
    if full[: len(base)] != base:
        return None
    ends = [i for i, t in enumerate(base) if t in end_of_turn]
    if not ends:
        return None
    # a reply that sampled its end-of-turn token continues after it; one cut by max_tokens or a stop string gets
    # the template's end-of-turn token as an observation (never trained), as the plain render would add it
    start = ends[-1] + 1 if hint.token_ids[-1] in end_of_turn else ends[-1]
    return list(hint.token_ids) + base[start:] + full[len(base) :]
