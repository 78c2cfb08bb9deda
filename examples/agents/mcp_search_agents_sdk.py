"""An OpenAI Agents SDK agent whose tools come from an MCP server: `rllm retrieve mcp`, over stdio.

The agent is written as the SDK's docs write MCP agents: an `MCPServerStdio` started for the run and handed to
`Agent(mcp_servers=[...])`; the SDK lists the server's tools (`search`, `open`) and calls them when the model asks.
Nothing in the agent knows about rllm's search code: the tools are whatever the MCP server offers. The rllm lines
are in `agent`: the model calls go through the episode's session (`run_config(config)`, every call recorded), the
server is started on the task's corpus with `--tool-log`, and the calls it logged (name, arguments, result size,
latency, error) become the episode's `tool_log`, which `rllm view` lists beside the LLM calls.

    rllm eval hotpotqa --agent examples/agents/mcp_search_agents_sdk.py:agent -n 10
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, Runner
from agents.mcp import MCPServerStdio

import rllm  # used by `agent` only

INSTRUCTIONS = ("Answer the question by searching Wikipedia: call search with a few keywords, open a passage by its "
                "id to read it, and search again for the next fact. End your reply with one line: "
                "'FINAL ANSWER: <short answer>'.")


async def ask(question: str, server: MCPServerStdio, run_config: Any = None, max_turns: int = 8) -> tuple[str, int]:
    """(the final output, the number of model calls)."""
    agent = Agent(name="researcher", instructions=INSTRUCTIONS, mcp_servers=[server])
    result = await Runner.run(agent, question, run_config=run_config, max_turns=max_turns)
    return str(result.final_output or ""), len(result.raw_responses)


@rllm.rollout(name="mcp_search_agents_sdk")
async def agent(task: rllm.Task, config: rllm.RolloutConfig) -> dict[str, Any]:
    from agents.exceptions import MaxTurnsExceeded

    from rllm_adapters.openai_agents import run_config
    from rllm_envs.tool_records import read_jsonl_records

    corpus = str(task.metadata["corpus"])
    with tempfile.TemporaryDirectory(prefix="rllm-mcp-") as tmp:
        log = Path(tmp) / "tools.jsonl"
        params = {"command": sys.executable,
                  "args": ["-m", "rllm", "retrieve", "mcp", "--corpus", corpus, "--tool-log", str(log)]}
        async with MCPServerStdio(params=params, name="rllm-search", client_session_timeout_seconds=60) as server:
            try:
                text, turns = await ask(str(task.metadata.get("question") or task.instruction), server,
                                        run_config(config), int(task.metadata.get("max_turns", 8)))
                stopped = "answer"
            except MaxTurnsExceeded:
                text, turns, stopped = "", int(task.metadata.get("max_turns", 8)), "max_turns"
        records = read_jsonl_records(log)
    searched = [r for r in records if r["name"] == "search"]
    return {"answer": text, "turns": turns, "stopped": stopped, "tool_log": records,
            "tool_calls": len(records), "searches": len(searched)}
