"""The search environment served: the retrieval server under concurrent clients (bounded, no errors, 503 when its
queue is full, clear 400s), the tools as an MCP server over stdio and streamable HTTP (the `mcp` SDK's own client),
and the search agent through the gateway, its tool calls recorded on the episode."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_search import CORPUS, QUERIES, search_mcp_over_http, write_corpus

from rllm_envs.search.bm25_index import BM25Index, open_index
from rllm_envs.search.corpus import Passage
from rllm_envs.search.hotpotqa import HotpotQA
from rllm_envs.search.remote import RemoteIndex
from rllm_envs.search.server import RetrievalServer
from rllm_envs.tool_records import read_jsonl_records
from rllm_rollout.engine import run_episodes
from rllm_testing.fake_upstream import start_fake_upstream


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index.build([Passage(id=f"d{i}", title=t, text=x) for i, (t, x) in enumerate(CORPUS)])


def test_many_clients_share_one_server_and_get_the_local_results(index: BM25Index) -> None:
    with RetrievalServer(index, max_concurrency=4) as server:
        remote = RemoteIndex(server.url)
        assert remote.health()["passages"] == len(CORPUS)

        def client(i: int) -> list[list[str]]:
            return [[h.id for h in remote.search(QUERIES[(i + j) % len(QUERIES)], 3)] for j in range(5)]

        with ThreadPoolExecutor(64) as pool:
            got = list(pool.map(client, range(64)))
        for i, rows in enumerate(got):
            assert rows == [[h.id for h in index.search(QUERIES[(i + j) % len(QUERIES)], 3)] for j in range(5)]
        health = remote.health()
        assert health["served"] == 64 * 5 + 0 and health["in_flight"] == 0 and health["refused_busy"] == 0
        assert remote.get("d3") == index.get("d3") and remote.get("missing") is None
        batch = httpx.post(f"{server.url}/retrieve", json={"queries": QUERIES[:2], "topk": 2, "return_scores": True})
        assert batch.status_code == 200
        first = batch.json()["result"][0][0]
        assert first["document"]["id"] == "d1" and first["document"]["contents"].startswith('"Kiss and Tell')
        assert first["score"] > 0 and len(batch.json()["result"]) == 2


@pytest.mark.parametrize(("body", "message"), [
    ({"queries": "one string"}, "a list of strings"), ({"queries": ["x"], "k": 0}, "from 1 to 100"),
    ({"queries": ["x"] * 300}, "at most 256"), ([1, 2], "JSON object"), ("not json", "JSON object")])
def test_bad_requests_get_a_400_that_says_why(index: BM25Index, body: Any, message: str) -> None:
    with RetrievalServer(index) as server:
        content = body if isinstance(body, str) else json.dumps(body)
        resp = httpx.post(f"{server.url}/search", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 400 and message in resp.json()["error"]


def test_a_full_queue_answers_503_and_the_client_retries(index: BM25Index) -> None:
    gate = threading.Event()

    class Slow:
        def __len__(self) -> int:
            return len(index)

        def search_batch(self, queries: list[str], k: int = 5) -> Any:
            gate.wait(10)
            return index.search_batch(queries, k)

        def get(self, doc_id: str) -> Any:
            return index.get(doc_id)

    with RetrievalServer(Slow(), max_concurrency=1, max_queue=0) as server, ThreadPoolExecutor(1) as pool:
        held = pool.submit(httpx.post, f"{server.url}/search", json={"queries": ["apple"]}, timeout=20)
        deadline = time.monotonic() + 10
        while httpx.get(f"{server.url}/health").json()["in_flight"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        busy = httpx.post(f"{server.url}/search", json={"queries": ["apple"]})
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1" and "busy" in busy.json()["error"]
        threading.Timer(0.3, gate.set).start()  # the client's retries outlast the held request
        assert [h.id for h in RemoteIndex(server.url).search("apple remote", 1)] == ["d4"]
        assert held.result().status_code == 200


def _mcp_round_trip(target: Any) -> tuple[list[str], str, str]:
    from mcp import Client

    async def go() -> tuple[list[str], str, str]:
        async with Client(target) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            found = await client.call_tool("search", {"query": "Kiss and Tell Corliss Archer", "k": 2})
            opened = await client.call_tool("open", {"doc_id": "d0"})
            return names, found.content[0].text, opened.content[0].text  # type: ignore[union-attr]

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_tools_round_trip_over_mcp_and_every_call_is_recorded(tmp_path: Path, transport: str) -> None:
    from mcp.client.stdio import StdioServerParameters

    corpus, log = write_corpus(tmp_path / "corpus.jsonl"), tmp_path / "tools.jsonl"
    env = {**os.environ, "RLLM_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "rllm", "retrieve", "mcp", "--corpus", str(corpus), "--tool-log", str(log)]
    if transport == "stdio":
        names, found, opened = _mcp_round_trip(StdioServerParameters(command=command[0], args=command[1:], env=env))
    else:
        with search_mcp_over_http(corpus, tmp_path / "home", log) as url:
            names, found, opened = _mcp_round_trip(url)
    assert names == ["open", "search"]
    assert found.startswith("[d1] Kiss and Tell (1945 film):") and opened.startswith("Shirley Temple\n")
    records = read_jsonl_records(log)
    assert [(r["name"], r["transport"], r["error"]) for r in records] == [("search", "mcp", None),
                                                                          ("open", "mcp", None)]
    assert records[0]["arguments"] == {"query": "Kiss and Tell Corliss Archer", "k": 2}
    assert records[0]["result_chars"] == len(found)


# ---------------------------------------------------------------- the agent
def _researcher(body: dict[str, Any]) -> Any:
    """Search the question, open the two best hits, answer."""
    assert [t["function"]["name"] for t in body["tools"]] == ["search", "open"]
    tool_results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not tool_results:
        return {"tool_call": {"name": "search", "arguments": {"query": "Corliss Archer Kiss and Tell", "k": 3}}}
    if len(tool_results) < 3:
        ids = [line.split("]")[0].lstrip("[") for line in tool_results[0].splitlines()]
        return {"tool_call": {"name": "open", "arguments": {"doc_id": ids[len(tool_results) - 1]}}}
    return "Shirley Temple played Corliss Archer; she became Chief of Protocol.\nFINAL ANSWER: Chief of Protocol"


@pytest.mark.parametrize("via_server", [False, True])
async def test_the_search_agent_answers_through_the_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            shared_data_dir: Path, via_server: bool) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    bench = HotpotQA()
    task = bench.load("test", str(shared_data_dir), max_examples=1)[0]
    server = None
    if via_server:
        server = RetrievalServer(open_index(task.metadata["corpus"])).start()
        monkeypatch.setenv("RLLM_RETRIEVER_URL", server.url)
    try:
        with start_fake_upstream(_researcher) as up:
            (ep,) = await run_episodes(bench.default_rollout(), [task], base_url=up.base_url, benchmark=bench,
                                       progress=False)
    finally:
        if server is not None:
            server.stop()
    assert ep.error is None and ep.reward == 1.0 and ep.is_correct
    assert len(ep.steps) == 4 and ep.artifacts["tool_calls"] == 3 and ep.artifacts["stopped"] == "answer"
    details = ep.artifacts["grading"]["details"]["scores"]
    assert details["em"] == 1 and details["supporting_recall"] >= 0.5 and details["supporting_recall_opened"] >= 0.5
    log = ep.artifacts["tool_log"]
    assert [r["name"] for r in log] == ["search", "open", "open"] and all(r["error"] is None for r in log)
    assert set(ep.artifacts["opened_ids"]) <= set(ep.artifacts["retrieved_ids"])


async def test_closed_book_and_rag_baselines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             shared_data_dir: Path) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    bench = HotpotQA()
    task = bench.load("test", str(shared_data_dir), max_examples=1)[0]
    with start_fake_upstream(lambda body: "FINAL ANSWER: Chief of Protocol") as up:
        closed = await run_episodes(bench.named_agent("closed_book"), [task], base_url=up.base_url,  # type: ignore[arg-type]
                                    benchmark=bench, progress=False)
        rag = await run_episodes(bench.named_agent("rag"), [task], base_url=up.base_url,  # type: ignore[arg-type]
                                 benchmark=bench, progress=False)
        rag_prompt = up.requests[-1]["messages"][0]["content"]
    assert closed[0].reward == rag[0].reward == 1.0
    assert closed[0].artifacts["grading"]["details"]["scores"]["supporting_recall"] == 0.0
    assert rag[0].artifacts["grading"]["details"]["scores"]["supporting_recall"] > 0 and "Passages:\n[1] " in rag_prompt
    assert len(rag[0].artifacts["retrieved_ids"]) == 3


@pytest.mark.parametrize("spec", ["examples/agents/search_openai.py:agent",
                                  "examples/agents/langgraph_search.py:agent"])
async def test_the_example_search_agents_run_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       shared_data_dir: Path, spec: str) -> None:
    from rllm_envs.eval import load_agent

    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    bench = HotpotQA()
    task = bench.load("test", str(shared_data_dir), max_examples=1)[0]
    with start_fake_upstream(_researcher) as up:
        (ep,) = await run_episodes(load_agent(spec), [task], base_url=up.base_url, benchmark=bench, progress=False)
    assert ep.error is None and ep.reward == 1.0 and ep.artifacts["turns"] == 4
    assert [r["name"] for r in ep.artifacts["tool_log"]] == ["search", "open", "open"]
    assert len(ep.steps) == 4 and all(s.completion_token_ids for s in ep.steps)  # every call recorded, exactly
    assert ep.artifacts["grading"]["details"]["scores"]["supporting_recall_opened"] >= 0.5


def test_the_eval_summary_averages_the_graders_scores_and_counts_tool_calls(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            shared_data_dir: Path) -> None:
    from rllm_envs.eval.summary import summarize

    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    bench = HotpotQA()
    tasks = bench.load("test", str(shared_data_dir), max_examples=2)
    with start_fake_upstream(lambda body: "FINAL ANSWER: Chief of Protocol") as up:
        eps = asyncio.run(run_episodes(bench.named_agent("rag"), tasks, base_url=up.base_url,  # type: ignore[arg-type]
                                       benchmark=bench, progress=False))
    summary = summarize(eps, benchmark="hotpotqa", split="test", model="m", attempts=1, wall_time_s=1.0)
    assert summary.grader_means["em"] == 0.5 and summary.grader_means["f1"] == 0.5  # right on the first only
    assert 0 < summary.grader_means["supporting_recall"] <= 1 and summary.tool_calls_per_episode == 3


async def test_an_agents_sdk_agent_uses_the_tools_over_mcp_and_the_episode_records_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_data_dir: Path) -> None:
    """The OpenAI Agents SDK's own MCPServerStdio runs `rllm retrieve mcp`; the model's calls go through the
    gateway, the tool calls through MCP, and both end up on the episode."""
    from rllm_envs.eval import load_agent

    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    bench = HotpotQA()
    task = bench.load("test", str(shared_data_dir), max_examples=1)[0]
    with start_fake_upstream(_researcher) as up:
        (ep,) = await run_episodes(load_agent("examples/agents/mcp_search_agents_sdk.py:agent"), [task],
                                   base_url=up.base_url, benchmark=bench, progress=False)
    assert ep.error is None and ep.reward == 1.0, ep.error
    assert [(r["name"], r["transport"], r["error"]) for r in ep.artifacts["tool_log"]] == [
        ("search", "mcp", None), ("open", "mcp", None), ("open", "mcp", None)]
    assert len(ep.steps) == 4 and all(s.completion_token_ids for s in ep.steps)
    assert ep.steps[0].endpoint == "responses" and ep.trajectories[0].name == "researcher"
