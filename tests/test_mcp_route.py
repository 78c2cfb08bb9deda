"""The relay's MCP route (rllm_harnesses.mcp_route): a host MCP server reached from the sandbox's socket by name and
nothing else, each tool call recorded with its result size, latency and error, an unreachable server a JSON-RPC
error and a recorded failure rather than a hang."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from test_search import search_mcp_over_http, write_corpus

from rllm_core.net import free_port
from rllm_harnesses.mcp_route import McpRoute, _messages_in
from rllm_harnesses.relay import HarnessRelay

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}


def _relay(upstreams: dict[str, str]) -> HarnessRelay:
    return HarnessRelay("http://127.0.0.1:9/sessions/x/v1", agent="probe", side_model="side", max_turns=1,
                        mcp=McpRoute(upstreams))


def _client(relay: HarnessRelay) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(relay.dir / "mcp.sock")), base_url="http://sandbox",
                        timeout=30)


def test_a_named_server_is_reached_others_are_not_and_each_tool_call_is_recorded(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    with search_mcp_over_http(corpus, tmp_path / "home") as url, _relay({"search": url}) as relay, \
            _client(relay) as client:
        other = client.post("/admin", json=INIT, headers=ACCEPT)
        assert other.status_code == 404 and "was given ['search']" in other.json()["error"]["message"]
        init = client.post("/search", json=INIT, headers=ACCEPT)
        assert init.status_code == 200, init.text
        session = {**ACCEPT, "Mcp-Session-Id": init.headers.get("mcp-session-id", ""),
                   "Mcp-Protocol-Version": "2025-06-18"}
        client.post("/search", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "search", "arguments": {"query": "Apple remote", "k": 1}}}
        answer = client.post("/search", json=call, headers=session)
        [reply] = _messages_in(answer.content, answer.headers.get("content-type", ""))
        text = reply["result"]["content"][0]["text"]
        assert text.startswith("[d4] Apple Remote:")
        missing = {**call, "id": 8, "params": {"name": "no_such_tool", "arguments": {}}}
        client.post("/search", json=missing, headers=session)
    first, second = relay.mcp.records  # type: ignore[union-attr]
    assert (first["name"], first["arguments"], first["result_chars"], first["error"]) == \
        ("search", {"query": "Apple remote", "k": 1}, len(text), None)
    assert second["name"] == "no_such_tool" and second["error"]  # the server's error, kept


def test_an_unreachable_server_is_a_json_rpc_error_and_a_recorded_failure() -> None:
    with _relay({"gone": f"http://127.0.0.1:{free_port('127.0.0.1')}/mcp"}) as relay, _client(relay) as client:
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "search", "arguments": {}}}
        answer = client.post("/gone", json=call, headers=ACCEPT)
    assert answer.status_code == 502 and answer.json()["id"] == 3 and "could not be reached" in answer.text
    [record] = relay.mcp.records  # type: ignore[union-attr]
    assert record["name"] == "search" and "could not be reached" in record["error"]


def test_answers_are_read_from_json_and_from_server_sent_events() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "hi"}]}}
    events = f"event: message\ndata: {json.dumps(message)}\n\n".encode()
    assert _messages_in(events, "text/event-stream") == [message]
    assert _messages_in(json.dumps([message, message]).encode(), "application/json") == [message, message]
    assert _messages_in(b"not json", "application/json") == []
