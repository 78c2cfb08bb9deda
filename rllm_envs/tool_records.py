"""What an environment's tool call leaves on the episode: name, arguments, result size, latency, error.

The model's side of a tool call (its name and arguments) is already in the captured completion; the environment's
side (what the tool returned, how long it took, whether it failed) is not. A `ToolLog` keeps that side, one
`ToolCallRecord` per call, and the rollout puts `records()` on `episode.artifacts["tool_log"]`, where `rllm view`
shows them beside the LLM calls. The MCP server writes the same records as JSONL (`append_jsonl`), so tools an
agent reaches over MCP are recorded the same way as tools called in process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllm_core.tool_record import ToolCallRecord, clip_arguments

__all__ = ["ToolCallRecord", "ToolLog", "read_jsonl_records"]

class ToolLog:
    """Records tool calls (thread-safe: tools may run in worker threads); optionally appends each to a JSONL file."""

    def __init__(self, path: Path | None = None, transport: str = "in_process") -> None:
        self._records: list[ToolCallRecord] = []
        self._lock = threading.Lock()
        self.path, self.transport = path, transport

    def call(self, name: str, arguments: dict[str, Any] | str, fn: Callable[[], str],
             is_error: Callable[[str], bool] = lambda text: text.startswith("Error:")) -> str:
        """Run `fn` (the tool) and record it; a tool's `Error: ...` text counts as an error, as does a raise
        (which propagates after it is recorded)."""
        started, clock = time.time(), time.monotonic()
        try:
            result = fn()
        except Exception as exc:
            self.add(ToolCallRecord(name=name, arguments=clip_arguments(arguments), result_chars=0,
                                    latency_s=time.monotonic() - clock, error=f"{type(exc).__name__}: {exc}"[:500],
                                    started_at=started, transport=self.transport))
            raise
        self.add(ToolCallRecord(name=name, arguments=clip_arguments(arguments), result_chars=len(result),
                                latency_s=round(time.monotonic() - clock, 6),
                                error=result[:500] if is_error(result) else None, started_at=started,
                                transport=self.transport))
        return result

    def add(self, record: ToolCallRecord) -> None:
        with self._lock:
            self._records.append(record)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(record.model_dump_json() + "\n")

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.model_dump() for r in self._records]


def read_jsonl_records(path: Path) -> list[dict[str, Any]]:
    """The records a ToolLog appended to `path` (a line cut by a killed writer is skipped, not fatal)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(ToolCallRecord.model_validate_json(line).model_dump())
        except ValueError:
            continue
    return out
