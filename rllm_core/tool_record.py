"""What one environment tool call leaves on an episode (`artifacts["tool_log"]`): name, arguments, result size,
latency, error. The environments' in-process tools (rllm_envs.tool_records), the MCP server and the harness
relay's MCP route all write this record, and `rllm view` reads it."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

__all__ = ["MAX_ARGUMENT_CHARS", "ToolCallRecord", "clip_arguments"]

MAX_ARGUMENT_CHARS = 2000


class ToolCallRecord(BaseModel):
    name: str
    arguments: dict[str, Any] | str
    result_chars: int
    latency_s: float
    error: str | None = None
    started_at: float
    transport: str = "in_process"


def clip_arguments(arguments: Any) -> dict[str, Any] | str:
    """The arguments as recorded: as given, or their JSON cut at MAX_ARGUMENT_CHARS."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
    if len(text) <= MAX_ARGUMENT_CHARS:
        return arguments if isinstance(arguments, dict | str) else text
    return text[:MAX_ARGUMENT_CHARS] + "...(cut)"
