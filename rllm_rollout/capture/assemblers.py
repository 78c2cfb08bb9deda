"""Which assembler parses a call's reply: one per API the capture knows."""

from __future__ import annotations

from typing import Any

from rllm_rollout.capture.assemble import CallAssembler
from rllm_rollout.capture.messages import MessagesAssembler, MessagesViaChatAssembler
from rllm_rollout.capture.request import CallRequest
from rllm_rollout.capture.responses import ResponsesAssembler

__all__ = ["make_assembler"]


def make_assembler(call: CallRequest, *, sse: bool, tokenizer: Any = None) -> CallAssembler:
    """The assembler for `call`: Responses and Messages calls get theirs (a Messages call translated for a
    Chat-only upstream the translating one), chat and completions calls `CallAssembler`."""
    cls: type[CallAssembler] = CallAssembler
    if call.endpoint == "responses":
        cls = ResponsesAssembler
    elif call.endpoint == "messages":
        cls = MessagesViaChatAssembler if call.source is not None else MessagesAssembler
    return cls(call, sse=sse, tokenizer=tokenizer)
