"""The multi-turn tool-calling loop the built-in tool agents share (FinQA's SQL tools, the search tools).

Each turn is one chat call with the tools offered as OpenAI functions; each tool call is run and its result sent
back as a `tool` message; the first reply without a tool call is the final answer, or the last reply once
`max_turns` calls are spent.

A server whose chat template has no tool support (rllm's `tiny-random`, many base models) rejects `tools` with a
400; the loop then says the tools in the system prompt and reads `<tool_call>{...}</tool_call>` from the text
(the Hermes/Qwen convention), with results sent back as user messages. So the same agent runs on any endpoint.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import openai

from rllm_core.context import AGENT_HEADER, current_agent
from rllm_core.types import Task
from rllm_rollout.chat import _split_params, make_client
from rllm_rollout.rollout import RolloutConfig

__all__ = ["parse_text_tool_calls", "run_tool_loop"]

_TEXT_TOOLS = (
    "\n\nTo call a tool, write exactly <tool_call>{{\"name\": TOOL, \"arguments\": {{...}}}}</tool_call> and stop; "
    "the result comes back in the next message. The tools:\n{specs}"
)
_TEXT_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)

_NO_NATIVE_TOOLS: set[tuple[str, str]] = set()
"""(upstream, model) pairs seen rejecting `tools` in this process: later episodes start in text mode, so only
the first episode carries the refused call as a failed step."""


def parse_text_tool_calls(text: str) -> list[tuple[str, str]]:
    """(name, JSON arguments) of each `<tool_call>{...}</tool_call>` in a reply; malformed ones are skipped."""
    calls = []
    for body in _TEXT_CALL.findall(text or ""):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append((obj["name"], json.dumps(obj.get("arguments") or {})))
    return calls


def _starts_native(task: Task, config: RolloutConfig) -> bool:
    """`tool_mode` ("native", "text", "auto": the default) from the task's metadata or the rollout config."""
    mode = str(task.metadata.get("tool_mode") or getattr(config, "tool_mode", None) or "auto")
    if mode not in ("native", "text", "auto"):
        raise ValueError(f"tool_mode must be 'native', 'text' or 'auto', got {mode!r}")
    return mode == "native" or (mode == "auto" and (str(config.upstream_url), config.model) not in _NO_NATIVE_TOOLS)


async def run_tool_loop(task: Task, config: RolloutConfig, *, system_prompt: str, user: str,
                        specs: list[dict[str, Any]], call_tool: Callable[[str, str], str],
                        max_turns: int) -> dict[str, Any]:
    """Run the loop; `call_tool(name, json_arguments)` runs one tool (in a worker thread) and returns its text.
    Returns the answer, the turn and tool-call counts, the tool mode used and why the loop stopped."""
    sdk, extra = _split_params(dict(config.sampling))
    agent = current_agent()
    headers = {AGENT_HEADER: agent} if agent else None
    text_system = system_prompt + _TEXT_TOOLS.format(specs=json.dumps([s["function"] for s in specs]))
    native = _starts_native(task, config)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt if native else text_system},
                                      {"role": "user", "content": user}]
    answer, turns, n_calls, stopped = "", 0, 0, "max_turns"
    async with make_client(config) as client:
        while turns < max_turns:
            kwargs: dict[str, Any] = dict(sdk)
            if (seed := config.call_seed(turns)) is not None:
                kwargs["seed"] = seed
            if native:
                kwargs["tools"] = specs
            try:
                resp = await client.chat.completions.create(
                    model=config.model, messages=messages,  # type: ignore[arg-type]
                    extra_body=extra or None, extra_headers=headers, **kwargs)
            except openai.BadRequestError as exc:
                if native and "tool" in str(exc).lower():
                    native = False
                    _NO_NATIVE_TOOLS.add((str(config.upstream_url), config.model))
                    messages[0] = {"role": "system", "content": text_system}
                    continue
                raise
            turns += 1
            msg = resp.choices[0].message
            content = msg.content or ""
            answer = content
            if native:
                calls = [(tc.id, tc.function.name, tc.function.arguments)
                         for tc in msg.tool_calls or [] if tc.type == "function"]
                entry: dict[str, Any] = {"role": "assistant", "content": content or None}
                if calls:
                    entry["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                           for i, n, a in calls]
                messages.append(entry)
            else:
                calls = [(f"text_{turns}_{k}", n, a) for k, (n, a) in enumerate(parse_text_tool_calls(content))]
                messages.append({"role": "assistant", "content": content})
            if not calls:
                stopped = "answer"
                break
            results = []
            for call_id, name, arguments in calls:
                n_calls += 1
                result = await asyncio.to_thread(call_tool, name, arguments)
                if native:
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
                else:
                    results.append(f"<tool_response name=\"{name}\">\n{result}\n</tool_response>")
            if results:
                messages.append({"role": "user", "content": "\n".join(results)})
    return {"answer": answer, "turns": turns, "tool_calls": n_calls, "tool_mode": "native" if native else "text",
            "stopped": stopped}
