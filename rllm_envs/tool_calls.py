"""One model tool call run against a table of Python functions: always text back, and recorded.

The built-in tool sets (FinQA's SQL tools, the search tools) answer a bad call (unknown tool, arguments that are not
a JSON object, a missing or extra argument, a tool that raises) with an `Error: ...` the model can read and fix, as a
tool result would from any real API, never with an exception that ends the episode. Each call is recorded on `log`
(`ToolLog`: name, arguments, result size, latency, error).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from rllm_envs.tool_records import ToolLog

__all__ = ["dispatch"]


def _run(name: str, args: dict[str, Any], tools: Mapping[str, Callable[..., str]],
         clip: Callable[[str], str]) -> str:
    fn = tools.get(name)
    if fn is None:
        return f"Error: unknown tool {name!r}; the tools are {', '.join(tools)}"
    try:
        return clip(fn(**args))
    except TypeError as exc:
        return f"Error: bad arguments for {name}: {exc}"
    except Exception as exc:  # a tool bug is the model's observation, never the episode's crash
        return f"Error: {name} failed: {type(exc).__name__}: {exc}"


def dispatch(name: str, arguments: str | dict[str, Any] | None, tools: Mapping[str, Callable[..., str]], log: ToolLog,
             *, example: str = "{}", clip: Callable[[str], str] = lambda text: text) -> str:
    """Run tool `name` of `tools` with its JSON `arguments`; `example` shows a well-formed object in the error for
    bad JSON, `clip` bounds the result's length."""
    try:
        args = json.loads(arguments or "{}") if isinstance(arguments, str) else dict(arguments or {})
    except json.JSONDecodeError as exc:
        message = f"Error: the arguments of {name} are not valid JSON ({exc.msg}); send an object like {example}"
        return log.call(name, str(arguments), lambda: message)
    if not isinstance(args, dict):
        return log.call(name, str(arguments), lambda: f"Error: the arguments of {name} must be a JSON object")
    return log.call(name, args, lambda: _run(name, args, tools, clip))
