"""The built-in search agent (Search-R1 style): the model searches, opens passages, and answers.

It runs the shared tool loop (`rllm_envs.tool_loop`) with `search` and `open`. The passages come from a retrieval
server when one is named (`RLLM_RETRIEVER_URL`, or the task's `retriever_url`: many rollout workers share one
index), else from the task's corpus file indexed in this process (built once, cached on disk, kept in memory
for the process's later episodes). The artifacts carry the ids the agent saw and opened (the benchmark scores
supporting-passage recall from them) and every tool call (`tool_log`).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from rllm_core.errors import BenchmarkError
from rllm_core.types import Task
from rllm_envs.search.bm25_index import BM25Index, open_index
from rllm_envs.search.tools import TOOL_SPECS, PassageSource, SearchTools
from rllm_envs.tool_loop import run_tool_loop
from rllm_envs.tool_records import ToolLog
from rllm_rollout.rollout import RolloutConfig, rollout

__all__ = ["DEFAULT_MAX_TURNS", "RAG_PASSAGES", "RETRIEVER_ENV", "SYSTEM_PROMPT", "passage_source", "rag_agent",
           "search_agent"]

DEFAULT_MAX_TURNS = 6
RAG_PASSAGES = 3
RETRIEVER_ENV = "RLLM_RETRIEVER_URL"
SYSTEM_PROMPT = (
    "You answer questions using a search engine over Wikipedia passages. Call search(query) with a few keywords "
    "for one fact at a time, open(doc_id) to read a passage in full, and search again for the next fact the "
    "question needs. When you know the answer, reply without a tool call and end with one line: "
    "'FINAL ANSWER: <answer>' (a short phrase: a name, a date, yes or no)."
)


_INDEX_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _cached_index(corpus: str) -> BM25Index:
    return open_index(corpus)


def _local_index(corpus: str) -> BM25Index:
    with _INDEX_LOCK:  # concurrent first episodes build it once
        return _cached_index(corpus)


def passage_source(task: Task) -> PassageSource:
    """The retrieval server named by the task or $RLLM_RETRIEVER_URL, else the task's corpus indexed here."""
    url = task.metadata.get("retriever_url") or os.environ.get(RETRIEVER_ENV)
    if url:
        from rllm_envs.search.remote import RemoteIndex

        return RemoteIndex(str(url))
    corpus = task.metadata.get("corpus")
    if not corpus:
        raise BenchmarkError(f"task {task.id} names no corpus and no retrieval server; set {RETRIEVER_ENV} or run "
                             "a benchmark whose tasks carry a corpus (hotpotqa)")
    return _local_index(str(corpus))


@rollout(name="search")
async def search_agent(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """One search episode: answer, ids retrieved and opened, the tool calls, turns."""
    import asyncio

    source = await asyncio.to_thread(passage_source, task)
    tools = SearchTools(source, ToolLog())
    max_turns = int(task.metadata.get("max_turns") or getattr(config, "max_turns", None) or DEFAULT_MAX_TURNS)
    question = str(task.metadata.get("question") or task.instruction)
    out = await run_tool_loop(task, config, system_prompt=SYSTEM_PROMPT, user=f"Question: {question}",
                              specs=TOOL_SPECS, call_tool=tools.call, max_turns=max_turns)
    return {**out, "retrieved_ids": list(dict.fromkeys(tools.retrieved_ids)),
            "opened_ids": list(dict.fromkeys(tools.opened_ids)), "tool_log": tools.log.records()}


@rollout(name="rag")
async def rag_agent(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """Retrieve-then-read, the baseline between closed-book and an agent that searches: the question itself is
    searched once (by the environment, not the model), its top passages go in the prompt, one call answers."""
    import asyncio

    from rllm_envs.search.answer_metrics import ANSWER_HINT
    from rllm_rollout.chat import chat, make_client

    source = await asyncio.to_thread(passage_source, task)
    tools = SearchTools(source, ToolLog(transport="environment"))
    question = str(task.metadata.get("question") or task.instruction)
    n = int(task.metadata.get("rag_passages") or RAG_PASSAGES)
    hits = await asyncio.to_thread(source.search, question, n)
    tools.retrieved_ids.extend(h.id for h in hits)
    passages = [await asyncio.to_thread(tools.call, "open", {"doc_id": h.id}) for h in hits]
    context = "\n\n".join(f"[{i + 1}] {text}" for i, text in enumerate(passages))
    prompt = f"Passages:\n{context}\n\nQuestion: {question}\n\n{ANSWER_HINT}"
    async with make_client(config) as client:
        reply = await chat(client, config, [{"role": "user", "content": prompt}], seed=config.call_seed(0))
    return {"answer": reply.text, "finish_reason": reply.finish_reason, "retrieved_ids": [h.id for h in hits],
            "opened_ids": list(dict.fromkeys(tools.opened_ids)), "tool_log": tools.log.records()}
