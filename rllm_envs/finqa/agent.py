"""The FinQA agent: a multi-turn tool-calling loop over the question's own SQLite database.

Each turn is one chat call with the tools offered as OpenAI functions; each tool call is run and its result sent
back as a `tool` message; the first reply without a tool call is the final answer (it should end with
`FINAL ANSWER: ...`), or the last reply once `max_turns` calls are spent. The database is built per episode in a
temporary directory and removed afterwards, so attempts never share state.

A server whose chat template has no tool support (rllm's `tiny-random`, many base models) rejects `tools` with a
400; the agent then says the tools in the system prompt and reads `<tool_call>{...}</tool_call>` from the text
(the Hermes/Qwen convention), with results sent back as user messages. So the same agent runs on any endpoint.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import openai

from rllm_core.context import AGENT_HEADER, current_agent
from rllm_core.types import Task
from rllm_envs.finqa.data import FinTable, materialise
from rllm_envs.finqa.tools import TOOL_SPECS, FinQATools
from rllm_rollout.chat import _split_params, make_client
from rllm_rollout.rollout import RolloutConfig, rollout

__all__ = ["DEFAULT_MAX_TURNS", "SYSTEM_PROMPT", "finqa_agent", "parse_text_tool_calls"]

DEFAULT_MAX_TURNS = 20
SYSTEM_PROMPT = (
    "You are a financial analyst answering a question about a company's 10-K tables. The tables are in a SQLite "
    "database. Call get_table_info (no argument) to list them, get_table_info(table_name) to see a table's columns "
    "and first rows, sql_query to read exact values, and calculator for arithmetic. Do not guess numbers: read them "
    "from the tables. When you are done, reply without a tool call and end with one line: 'FINAL ANSWER: <answer>' "
    "(a number with its unit or %, e.g. 'FINAL ANSWER: 12.5%')."
)
_TEXT_TOOLS = (
    "\n\nTo call a tool, write exactly <tool_call>{{\"name\": TOOL, \"arguments\": {{...}}}}</tool_call> and stop; "
    "the result comes back in the next message. The tools:\n{specs}"
)
_TEXT_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


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


_NO_NATIVE_TOOLS: set[tuple[str, str]] = set()
"""(upstream, model) pairs seen rejecting `tools` in this process: later episodes start in text mode, so only
the first episode carries the refused call as a failed step."""


def _rejects_tools(exc: openai.BadRequestError) -> bool:
    return "tool" in str(exc).lower()


def _starts_native(task: Task, config: RolloutConfig) -> bool:
    """`tool_mode` ("native", "text", "auto": the default) from the task's metadata or the rollout config."""
    mode = str(task.metadata.get("tool_mode") or getattr(config, "tool_mode", None) or "auto")
    if mode not in ("native", "text", "auto"):
        raise ValueError(f"tool_mode must be 'native', 'text' or 'auto', got {mode!r}")
    return mode == "native" or (mode == "auto" and (str(config.upstream_url), config.model) not in _NO_NATIVE_TOOLS)


def _text_system() -> dict[str, Any]:
    specs = json.dumps([s["function"] for s in TOOL_SPECS])
    return {"role": "system", "content": SYSTEM_PROMPT + _TEXT_TOOLS.format(specs=specs)}


@rollout(name="finqa")
async def finqa_agent(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """One FinQA episode; the artifacts hold the answer, the tables inspected and the turn count."""
    meta = task.metadata
    tables = [FinTable.model_validate(t) for t in meta.get("tables") or []]
    max_turns = int(meta.get("max_turns") or getattr(config, "max_turns", None) or DEFAULT_MAX_TURNS)
    question = str(meta.get("question") or task.instruction)
    company = str(meta.get("company") or "")
    user = f"Company: {company}\n\nQuestion: {question}" if company else f"Question: {question}"
    sdk, extra = _split_params(dict(config.sampling))
    agent = current_agent()
    headers = {AGENT_HEADER: agent} if agent else None
    with tempfile.TemporaryDirectory(prefix="rllm-finqa-") as tmp:
        catalogue = await asyncio.to_thread(materialise, tables, Path(tmp) / "tables.sqlite")
        with FinQATools(Path(tmp) / "tables.sqlite", catalogue) as tools:
            messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                              {"role": "user", "content": user}]
            native, answer, turns, n_calls, stopped = _starts_native(task, config), "", 0, 0, "max_turns"
            if not native:
                messages[0] = _text_system()
            async with make_client(config) as client:
                while turns < max_turns:
                    kwargs: dict[str, Any] = dict(sdk)
                    if (seed := config.call_seed(turns)) is not None:
                        kwargs["seed"] = seed
                    if native:
                        kwargs["tools"] = TOOL_SPECS
                    try:
                        resp = await client.chat.completions.create(
                            model=config.model, messages=messages,  # type: ignore[arg-type]
                            extra_body=extra or None, extra_headers=headers, **kwargs)
                    except openai.BadRequestError as exc:
                        if native and _rejects_tools(exc):
                            native = False
                            _NO_NATIVE_TOOLS.add((str(config.upstream_url), config.model))
                            messages[0] = _text_system()
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
                            entry["tool_calls"] = [{"id": i, "type": "function",
                                                    "function": {"name": n, "arguments": a}} for i, n, a in calls]
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
                        result = await asyncio.to_thread(tools.call, name, arguments)
                        if native:
                            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
                        else:
                            results.append(f"<tool_response name=\"{name}\">\n{result}\n</tool_response>")
                    if results:
                        messages.append({"role": "user", "content": "\n".join(results)})
            accessed = list(dict.fromkeys(tools.accessed_tables))
    return {"answer": answer, "accessed_tables": accessed, "turns": turns, "tool_calls": n_calls,
            "tool_mode": "native" if native else "text", "stopped": stopped}
