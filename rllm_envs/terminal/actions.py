"""The terminal agent's two action formats and its observations, as pure functions (tested without a model).

- **tools**: the OpenAI tool `bash` (one string argument, `command`); a reply without a tool call ends the episode.
- **text**, for models without tool calling: one fenced block per reply (```bash, ```sh, ```shell or a bare fence)
  holds the command; a reply with no block that says `DONE` ends the episode; a reply with neither is a format
  error (the model is told what to write, and the episode ends after a few in a row).

Observations are the exit code then the output, cut to a head and a tail when long (the middle of a build log or a
`cat` of a big file is rarely what the model needs, and an uncut one can fill a context in one turn), saying how
much was cut so the model knows to look closer (`head`, `grep`, `sed -n`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from rllm_core.sandbox import ExecResult

__all__ = ["BASH_TOOL", "DONE_WORD", "TextAction", "format_observation", "parse_bash_arguments",
           "parse_text_action", "truncate_middle"]

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task's sandbox and get its exit code and output (stdout and "
                       "stderr together). Each call runs in a fresh shell in the working directory.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command(s) to run."}},
            "required": ["command"],
        },
    },
}

DONE_WORD = "DONE"
"""What a text-format reply says (with no command block) to end the episode."""

_FENCE = re.compile(r"```[ \t]*(bash|sh|shell|console)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_DONE = re.compile(rf"\b{DONE_WORD}\b")


@dataclass(frozen=True)
class TextAction:
    """What one text-format reply asks for."""

    kind: Literal["command", "done", "none"]
    command: str = ""
    blocks: int = 0
    """How many command blocks the reply had (only the first one runs)."""


def parse_text_action(text: str) -> TextAction:
    """The first fenced block's command; else `done` when the reply says DONE (uppercase, a word of its own); else
    `none`. A block wins over DONE: the model should see what its last command did before it finishes."""
    blocks = [m.group(2).strip() for m in _FENCE.finditer(text or "")]
    blocks = [b for b in blocks if b]
    if blocks:
        return TextAction("command", blocks[0], len(blocks))
    if _DONE.search(text or ""):
        return TextAction("done")
    return TextAction("none")


def parse_bash_arguments(name: str, arguments: str | None) -> tuple[str | None, str | None]:
    """(command, None) for a well-formed `bash` call; (None, what is wrong) otherwise, said so the model can fix it."""
    if name != "bash":
        return None, f"error: there is no tool {name!r}; the only tool is `bash` (argument: command)"
    try:
        args = json.loads(arguments or "{}")
    except ValueError as exc:
        return None, f"error: the arguments of bash are not valid JSON ({exc}); send {{\"command\": \"...\"}}"
    command = args.get("command") if isinstance(args, dict) else None
    if not isinstance(command, str) or not command.strip():
        return None, "error: bash needs a non-empty string argument `command`"
    return command, None


def truncate_middle(text: str, limit: int) -> str:
    """`text` when it fits in `limit` characters; else its head and tail around a note saying how much was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut from the middle of the output ...]\n{text[-tail:]}"


def format_observation(result: ExecResult, limit: int) -> str:
    """What the model sees after a command: exit code (and a timeout note) then the output, cut to `limit`."""
    lines = []
    if result.timed_out:
        lines.append(f"the command timed out after {result.duration_s:.0f} s and was killed")
    lines.append(f"exit code: {result.exit_code}")
    output = result.output
    if not output.strip():
        lines.append("(no output)")
    else:
        lines.append(truncate_middle(output, limit))
        if result.truncated:
            lines.append("[the sandbox itself kept only the start and end of a larger output]")
    return "\n".join(lines)
