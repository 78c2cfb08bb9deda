"""Bad input and vanished clients: each gets a clear answer, and the server keeps serving after every one."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch

from rllm_serve import RunningPolicyServer, load_model, start_policy_server

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningPolicyServer]:
    torch.set_num_threads(1)
    with start_policy_server(load_model("tiny-random"), max_batch_size=8) as s:
        yield s


@pytest.fixture
def client(server: RunningPolicyServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c
    # after every bad request: still healthy, nothing left in the batch, and still answering
    assert wait_until_idle(server)
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        ok = c.post("/chat/completions", json={"messages": MSG, "max_tokens": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"][0]["message"]["content"]) > 0


def wait_until_idle(server: RunningPolicyServer, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        h = httpx.get(server.url + "/health").json()
        if h["running"] == 0 and h["waiting"] == 0:
            return True
        time.sleep(0.02)
    return False


def error_of(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["type"] in ("invalid_request_error", "not_found_error")
    return str(body["message"])


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("temperature", -0.5, "temperature"),
    ("top_p", 1.5, "top_p"),
    ("top_p", 0, "top_p"),
    ("n", 0, "'n'"),
    ("max_tokens", 0, "max_tokens"),
    ("top_logprobs", 50, "top_logprobs"),
    ("stop", [""], "stop"),
])
def test_invalid_sampling_values_are_400(client: httpx.Client, field: str, value: Any, needle: str) -> None:
    msg = error_of(client.post("/chat/completions", json={"messages": MSG, field: value}), 400)
    assert needle in msg and repr(value) in msg


def test_prompt_plus_max_tokens_over_context_names_both_numbers(client: httpx.Client) -> None:
    r = client.post("/completions", json={"prompt": list(range(100, 140)), "max_tokens": 2030})
    msg = error_of(r, 400)
    assert "prompt has 40 tokens" in msg and "max_tokens is 2030" in msg and "context length of 2048" in msg
    too_long = client.post("/completions", json={"prompt": [5] * 2048})
    assert "2048" in error_of(too_long, 400)


def test_unknown_model_is_404_listing_the_served_one(client: httpx.Client) -> None:
    msg = error_of(client.post("/chat/completions", json={"model": "gpt-9", "messages": MSG}), 404)
    assert "gpt-9" in msg and "tiny-random" in msg
    assert client.post("/chat/completions", json={"model": "default", "messages": MSG, "max_tokens": 1}
                       ).status_code == 200


def test_malformed_requests_are_400(client: httpx.Client) -> None:
    assert "JSON" in error_of(client.post("/chat/completions", content=b"{nope"), 400)
    assert "messages" in error_of(client.post("/chat/completions", json={"messages": []}), 400)
    assert "messages" in error_of(client.post("/chat/completions", json={"prompt": "x"}), 400)
    assert "49152" in error_of(client.post("/completions", json={"prompt": [1, 10**9]}), 400)
    assert "one prompt" in error_of(client.post("/completions", json={"prompt": ["a", "b"]}), 400)
    assert "empty" in error_of(client.post("/completions", json={"prompt": ""}), 400)
    assert "echo" in error_of(client.post("/completions", json={"prompt": "a", "echo": True}), 400)


def test_streaming_client_disconnect_frees_its_slot(server: RunningPolicyServer, client: httpx.Client) -> None:
    body = {"messages": MSG, "max_tokens": 1900, "ignore_eos": True, "stream": True}
    with client.stream("POST", "/chat/completions", json=body) as r:
        lines = r.iter_lines()  # kept open: leaving a for-loop early would close the connection right there
        first = [next(lines) for _ in range(7)]
        assert first[0].startswith("data: ")
        assert httpx.get(server.url + "/health").json()["running"] == 1
    assert wait_until_idle(server, within_s=2.0)


def test_non_streaming_client_disconnect_frees_its_slot(server: RunningPolicyServer) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    payload = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1900, "ignore_eos": true}'
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        deadline = time.monotonic() + 5
        while httpx.get(server.url + "/health").json()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert httpx.get(server.url + "/health").json()["running"] == 1
    assert wait_until_idle(server, within_s=2.0)


def test_openai_sdk_client(server: RunningPolicyServer) -> None:
    """The real openai client: vLLM fields arrive in model_extra, streaming works, errors map to SDK errors."""
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    out = c.chat.completions.create(model=server.model_name, messages=MSG, max_tokens=5, logprobs=True,
                                    temperature=0.5, extra_body={"return_token_ids": True})
    choice = out.choices[0]
    assert len(choice.logprobs.content) == 5
    assert len(choice.model_extra["token_ids"]) == 5
    assert out.model_extra["prompt_token_ids"] and out.model_extra["policy_version"] == 0
    chunks = list(c.chat.completions.create(model=server.model_name, messages=MSG, max_tokens=4, stream=True,
                                            temperature=0))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    greedy = c.chat.completions.create(model=server.model_name, messages=MSG, max_tokens=4, temperature=0)
    assert text == greedy.choices[0].message.content
    comp = c.completions.create(model=server.model_name, prompt="Hello", max_tokens=3, logprobs=1)
    assert len(comp.choices[0].logprobs.token_logprobs) == 3
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=MSG)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=server.model_name, messages=MSG, temperature=-1)


def test_a_disconnect_does_not_disturb_its_batch_neighbours(server: RunningPolicyServer, client: httpx.Client
                                                            ) -> None:
    """One streaming client leaves mid-batch; the other finishes with exactly the model's logprobs."""
    keep_body = {"messages": MSG, "max_tokens": 120, "ignore_eos": True, "logprobs": True, "return_token_ids": True,
                 "temperature": 0.9, "seed": 5}
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(client.post("/chat/completions", json=keep_body).json()))
    with client.stream("POST", "/chat/completions", json={"messages": [{"role": "user", "content": "other"}],
                                                           "max_tokens": 1900, "ignore_eos": True,
                                                           "stream": True}) as r:
        lines = r.iter_lines()
        next(lines)
        worker.start()
        deadline = time.monotonic() + 5
        while httpx.get(server.url + "/health").json()["running"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        [next(lines) for _ in range(4)]
    worker.join(60)
    ch = result["choices"][0]
    assert len(ch["token_ids"]) == 120
    with torch.no_grad():
        logits = server.loaded.model(torch.tensor([result["prompt_token_ids"] + ch["token_ids"]])).logits[0]
    lp = torch.log_softmax(logits[len(result["prompt_token_ids"]) - 1:-1] / 0.9, -1)
    ref = lp[torch.arange(120), torch.tensor(ch["token_ids"])]
    got = torch.tensor([c["logprob"] for c in ch["logprobs"]["content"]])
    assert float((got - ref).abs().max()) <= 1e-4


def test_seeds_across_the_int64_range_work_and_larger_ones_are_400(client: httpx.Client) -> None:
    """A seed at the int64 edges (plus the choice index) must not overflow the generator and hang the client."""
    for seed in (2**63 - 1, -(2**63), -1):
        body = {"messages": MSG, "max_tokens": 3, "n": 2, "seed": seed, "return_token_ids": True}
        a, b = (client.post("/chat/completions", json=body) for _ in range(2))
        assert a.status_code == b.status_code == 200, a.text
        assert [c["token_ids"] for c in a.json()["choices"]] == [c["token_ids"] for c in b.json()["choices"]]
    msg = error_of(client.post("/chat/completions", json={"messages": MSG, "seed": 2**64}), 400)
    assert "seed" in msg and str(2**64) in msg


def test_null_fields_mean_the_default(client: httpx.Client) -> None:
    body = {"messages": MSG, "max_tokens": 2, "n": None, "stream": None, "temperature": None, "top_p": None,
            "stop": None, "seed": None, "logprobs": None, "return_token_ids": None, "stream_options": None}
    out = client.post("/chat/completions", json=body)
    assert out.status_code == 200, out.text
    assert len(out.json()["choices"]) == 1 and out.json()["choices"][0]["logprobs"] is None


def test_a_vanishingly_small_temperature_is_greedy_with_finite_logprobs(client: httpx.Client) -> None:
    """logits / 1e-40 overflows fp32; like vLLM, T < 1e-5 decodes greedily and reports logprobs at T = 1."""
    body = {"messages": MSG, "max_tokens": 4, "logprobs": True, "return_token_ids": True}
    tiny = client.post("/chat/completions", json={**body, "temperature": 1e-40})
    assert tiny.status_code == 200 and "NaN" not in tiny.text
    greedy = client.post("/chat/completions", json={**body, "temperature": 0}).json()["choices"][0]
    ch = tiny.json()["choices"][0]
    assert ch["token_ids"] == greedy["token_ids"]
    assert [c["logprob"] for c in ch["logprobs"]["content"]] == [c["logprob"] for c in greedy["logprobs"]["content"]]


def test_unknown_routes_get_an_openai_shaped_error_saying_where_the_api_is(server: RunningPolicyServer) -> None:
    """A base URL missing /v1 used to get aiohttp's plain-text '404: Not Found' (the SDK showed just that)."""
    root = server.base_url.removesuffix("/v1")
    with httpx.Client(timeout=30) as c:
        missing = c.post(f"{root}/chat/completions", json={"messages": MSG})
        wrong_method = c.get(f"{server.base_url}/chat/completions")
    assert missing.status_code == 404 and "the OpenAI API is under /v1" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405 and "use POST" in wrong_method.json()["error"]["message"]
