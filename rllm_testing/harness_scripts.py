"""Scripted upstreams for the built-in harnesses: each harness's own tools, called in the order a real model would
to run a shell command, edit a file and finish the `fix-greeting` task (tests/data/harness_tasks).

`scripted_responder(name)` is a FakeUpstream responder: the reply to a request is the script's next step, chosen
by how many replies the request's history carries (so a harness that retries a call gets the same step again). A call
with the side model (titles, summaries) gets a short text reply and does not advance the script.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["LIST", "SCRIPTS", "SED", "scripted_responder"]

LIST = "ls /app > /app/listing.txt"
SED = "sed -i 's/helo world/hello world/' /app/hello.txt"
_EDIT = {"file_path": "/app/hello.txt", "old_string": "helo world", "new_string": "hello world"}

Step = tuple[str, dict[str, Any]] | str


def _block(thought: str, command: str) -> str:
    """A reply in mini-swe-agent's text mode: a thought, then one fenced command."""
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"

SCRIPTS: dict[str, list[Step]] = {
    "claude-code": [("Bash", {"command": LIST, "description": "List /app"}), ("Read", {"file_path": "/app/hello.txt"}),
                    ("Edit", _EDIT), "Done: listed /app and fixed the greeting."],
    "codex": [("exec_command", {"cmd": LIST}), ("exec_command", {"cmd": SED}),
              "Done: listed /app and fixed the greeting."],
    "qwen-code": [("run_shell_command", {"command": LIST, "description": "List /app"}),
                  ("read_file", {"file_path": "/app/hello.txt"}), ("edit", _EDIT),
                  "Done: listed /app and fixed the greeting."],
    "mini-swe-agent": [_block("List /app first.", LIST), _block("Now fix the typo.", SED),
                       _block("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")],
}


def scripted_responder(name: str, side_model: str = "rllm-side") -> Callable[[dict[str, Any]], Any]:
    script = SCRIPTS[name]

    def respond(body: dict[str, Any]) -> Any:
        if body.get("model") == side_model:
            return "Fix greeting"
        done = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")  # replies so far
        step = script[min(done, len(script) - 1)]
        if isinstance(step, str):
            return step
        tool, arguments = step
        return {"tool_call": {"name": tool, "arguments": arguments}}

    return respond
