"""Search environments: a corpus, its BM25 index (bm25s), the `search` / `open` tools, the `hotpotqa` benchmark,
a retrieval server shared by rollout workers, and the tools as an MCP server.

    from rllm_envs.search import open_index, SearchTools
    tools = SearchTools(open_index("../shared/data/hotpotqa/dev_subsampled.jsonl"))
    print(tools.call("search", {"query": "Kiss and Tell 1945 film"}))
"""

from typing import Any

_NAMES = {"open_index": "bm25_index", "BM25Index": "bm25_index", "SearchHit": "bm25_index",
          "Passage": "corpus", "read_corpus": "corpus", "SearchTools": "tools", "TOOL_SPECS": "tools",
          "HotpotQA": "hotpotqa", "search_agent": "agent", "RetrievalServer": "server", "RemoteIndex": "remote",
          "build_mcp_server": "mcp_server", "score_answer": "answer_metrics"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    """Lazy (PEP 562): the plugin imports this package while every plugin loads, which must stay light."""
    if name not in _NAMES:
        raise AttributeError(f"module 'rllm_envs.search' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"rllm_envs.search.{_NAMES[name]}"), name)
