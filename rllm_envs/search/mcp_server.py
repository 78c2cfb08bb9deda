"""The search tools as an MCP server (the official `mcp` SDK's MCPServer), over stdio or streamable HTTP.

An MCP-speaking agent (LangChain's MCP adapters, the OpenAI Agents SDK, Claude Code, Codex) then uses `search`
and `open` with no code of ours in it: the agent is unchanged. Each call is recorded like an in-process tool call
(`ToolLog`, transport "mcp"), and with `tool_log` set the records are appended to that JSONL file as they happen,
which the episode that started the server reads into `artifacts["tool_log"]`.

    rllm retrieve mcp --corpus ../shared/data/hotpotqa/dev_subsampled.jsonl                    # stdio
    rllm retrieve mcp --corpus ... --transport http --port 8765                                # /mcp
    rllm retrieve mcp --retriever http://127.0.0.1:8010                    # tools over a retrieval server
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm_envs.search.tools import MAX_K, PassageSource, SearchTools
from rllm_envs.tool_records import ToolLog

__all__ = ["build_mcp_server", "run_mcp_server"]


def build_mcp_server(source: PassageSource, log: ToolLog | None = None) -> Any:
    """An MCPServer with `search` and `open` over `source` (calls recorded on `log`)."""
    from mcp.server.mcpserver import MCPServer

    tools = SearchTools(source, log or ToolLog(transport="mcp"))
    server = MCPServer(name="rllm-search", instructions="Search Wikipedia passages (search), then read one in "
                       "full by its id (open).")

    @server.tool(name="search", description="Search the passages: the best matches with their id, title and the "
                 f"start of their text. Short keyword queries, one fact at a time; k from 1 to {MAX_K}.")
    def search(query: str, k: int = 5) -> str:
        return tools.call("search", {"query": query, "k": k})

    @server.tool(name="open", description="Read a whole passage by the id a search returned.")
    def open_passage(doc_id: str) -> str:
        return tools.call("open", {"doc_id": doc_id})

    server.search_tools = tools  # type: ignore[attr-defined]  (the ids seen and opened, for whoever started it)
    return server


def run_mcp_server(source: PassageSource, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765,
                   tool_log: Path | None = None) -> None:
    """Serve until stopped (stdio: until the client closes stdin)."""
    server = build_mcp_server(source, ToolLog(tool_log, transport="mcp"))
    if transport == "stdio":
        server.run("stdio")
    elif transport == "http":
        import anyio

        anyio.run(lambda: server.run_streamable_http_async(host=host, port=port))
    else:
        raise ValueError(f"transport must be stdio or http, got {transport!r}")
