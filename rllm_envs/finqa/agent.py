"""The FinQA agent: a multi-turn tool-calling loop (`rllm_envs.tool_loop`) over the question's own SQLite database.

The first reply without a tool call is the final answer (it should end with `FINAL ANSWER: ...`). The database is
built per episode in a temporary directory and removed afterwards, so attempts never share state. Each tool call
is recorded on the episode (`artifacts["tool_log"]`: name, arguments, result size, latency, error).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from rllm_core.types import Task
from rllm_envs.finqa.data import FinTable, materialise
from rllm_envs.finqa.tools import TOOL_SPECS, FinQATools
from rllm_envs.tool_loop import parse_text_tool_calls, run_tool_loop
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


@rollout(name="finqa")
async def finqa_agent(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """One FinQA episode; the artifacts hold the answer, the tables inspected, the tool calls and the turn count."""
    meta = task.metadata
    tables = [FinTable.model_validate(t) for t in meta.get("tables") or []]
    max_turns = int(meta.get("max_turns") or getattr(config, "max_turns", None) or DEFAULT_MAX_TURNS)
    question = str(meta.get("question") or task.instruction)
    company = str(meta.get("company") or "")
    user = f"Company: {company}\n\nQuestion: {question}" if company else f"Question: {question}"
    with tempfile.TemporaryDirectory(prefix="rllm-finqa-") as tmp:
        catalogue = await asyncio.to_thread(materialise, tables, Path(tmp) / "tables.sqlite")
        with FinQATools(Path(tmp) / "tables.sqlite", catalogue) as tools:
            out = await run_tool_loop(task, config, system_prompt=SYSTEM_PROMPT, user=user, specs=TOOL_SPECS,
                                      call_tool=tools.call, max_turns=max_turns)
            accessed = list(dict.fromkeys(tools.accessed_tables))
    return {**out, "accessed_tables": accessed, "tool_log": tools.log.records()}
