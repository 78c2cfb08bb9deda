"""The search agent's tools: `search(query, k)` (titles and snippets with ids) and `open(doc_id)` (a passage).

Exposed the way the FinQA tools are: OpenAI function specs (`TOOL_SPECS`) and `call(name, arguments)`, which
always returns text (a bad call comes back as an `Error: ...` the model can read and fix). The tools run over a
local `BM25Index` or over a retrieval server (`RemoteIndex`, `rllm retrieve serve`), the same text either way.
Every call is logged (`ToolLog`), and the ids the agent saw (searched) and read (opened) are kept, from which
the benchmark scores supporting-passage recall.
"""

from __future__ import annotations

from typing import Any, Protocol

from rllm_envs.search.bm25_index import SearchHit
from rllm_envs.search.corpus import Passage
from rllm_envs.tool_calls import dispatch
from rllm_envs.tool_records import ToolLog

__all__ = ["MAX_K", "TOOL_SPECS", "PassageSource", "SearchTools", "format_hits"]

MAX_K = 20
TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the Wikipedia passages. Returns the best matches with their id, title and the start "
                       "of their text. Use short keyword queries, one fact at a time.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "keywords, e.g. 'Kiss and Tell 1945 film actress'"},
            "k": {"type": "integer", "description": f"how many results (1-{MAX_K}, default 5)"}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "open",
        "description": "Read a whole passage by the id a search returned.",
        "parameters": {"type": "object", "properties": {"doc_id": {"type": "string"}}, "required": ["doc_id"]}}},
]


class PassageSource(Protocol):
    """What the tools search: a local BM25Index or a RemoteIndex (the retrieval server)."""

    def search(self, query: str, k: int = 5) -> list[SearchHit]: ...

    def get(self, doc_id: str) -> Passage | None: ...


def format_hits(hits: list[SearchHit]) -> str:
    if not hits:
        return "No passage matched. Try other keywords."
    return "\n".join(f"[{h.id}] {h.title}: {h.snippet}" for h in hits)


class SearchTools:
    """`search` and `open` over `source`, with every call logged and the ids seen and read kept."""

    def __init__(self, source: PassageSource, log: ToolLog | None = None, *, max_chars: int = 4000) -> None:
        self.source, self.log, self.max_chars = source, log or ToolLog(), max_chars
        self.retrieved_ids: list[str] = []
        self.opened_ids: list[str] = []

    def call(self, name: str, arguments: str | dict[str, Any] | None) -> str:
        """Run one tool call by name with its JSON arguments (`rllm_envs.tool_calls.dispatch`); always a string."""
        return dispatch(name, arguments, {"search": self.search, "open": self.open}, self.log,
                        example='{"query": "..."}', clip=self._clip)

    def _clip(self, text: str) -> str:
        return text if len(text) <= self.max_chars else text[: self.max_chars] + "\n...(cut)"

    def search(self, query: str, k: int | str = 5) -> str:
        query = str(query or "").strip()
        if not query:
            return "Error: the query is empty; send some keywords"
        try:
            k = int(k)
        except (TypeError, ValueError):
            return f"Error: k must be a whole number from 1 to {MAX_K}, got {k!r}"
        hits = self.source.search(query, max(1, min(k, MAX_K)))
        self.retrieved_ids.extend(h.id for h in hits)
        return format_hits(hits)

    def open(self, doc_id: str) -> str:
        doc_id = str(doc_id or "").strip().strip("[]")
        passage = self.source.get(doc_id)
        if passage is None:
            return f"Error: no passage {doc_id!r}; use an id from a search result, like p1a2b3c4d5e6"
        self.opened_ids.append(passage.id)
        return f"{passage.title}\n{passage.text}"
