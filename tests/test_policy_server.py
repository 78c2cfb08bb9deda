"""The local policy server over HTTP with `tiny-random`: shapes, logprob fidelity, batching, streaming."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import torch

from rllm_serve import LoadedModel, RunningPolicyServer, load_model, start_policy_server

MSG = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def reference(loaded: LoadedModel) -> torch.nn.Module:
    """An untouched copy of the served model, taken before the server packs its layers: an independent forward."""
    return copy.deepcopy(loaded.model)


@pytest.fixture(scope="module")
def server(loaded: LoadedModel, reference: torch.nn.Module) -> Iterator[RunningPolicyServer]:
    torch.set_num_threads(1)
    with start_policy_server(loaded, max_batch_size=16) as s:
        yield s


@pytest.fixture
def client(server: RunningPolicyServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


def chat(client: httpx.Client, **body: Any) -> dict[str, Any]:
    body.setdefault("messages", MSG)
    r = client.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def fresh_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
                   ) -> torch.Tensor:
    """log_softmax(logits / T) of `completion` from one plain forward pass over prompt + completion."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    t = temperature or 1.0
    lp = torch.log_softmax(logits[len(prompt) - 1:-1] / t, dim=-1)
    return lp[torch.arange(len(completion)), torch.tensor(completion)]


def sse_events(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
            elif line == "data: [DONE]":
                out.append({"done": True})
    return out


def test_chat_returns_vllm_fields_and_logprobs(server: RunningPolicyServer, client: httpx.Client) -> None:
    out = chat(client, model=server.model_name, max_tokens=6, logprobs=True, top_logprobs=3, return_token_ids=True)
    tok = server.loaded.tokenizer
    expected_prompt = tok.encode(tok.apply_chat_template(MSG, tokenize=False, add_generation_prompt=True),
                                 add_special_tokens=False)
    assert out["prompt_token_ids"] == expected_prompt
    assert out["policy_version"] == server.policy_version == 0
    ch = out["choices"][0]
    assert len(ch["token_ids"]) == 6 and ch["finish_reason"] == "length"
    content = ch["logprobs"]["content"]
    assert [c["token"] for c in content] == [tok.decode([t]) for t in ch["token_ids"]]
    assert all(len(c["top_logprobs"]) == 3 and c["top_logprobs"][0]["logprob"] >= c["logprob"] for c in content)
    assert ch["message"]["content"] == tok.decode(ch["token_ids"], skip_special_tokens=True)
    assert out["usage"] == {"prompt_tokens": len(expected_prompt), "completion_tokens": 6,
                            "total_tokens": len(expected_prompt) + 6}


def test_concurrent_logprobs_match_a_fresh_forward_pass(reference: torch.nn.Module, client: httpx.Client) -> None:
    """Requests of different lengths joining and leaving the batch report exactly the model's logprobs."""
    prompts = ["hi", "Tell me a very long story about dragons, knights and a castle by the sea.", "2+2?",
               "Explain photosynthesis in one sentence, please, for a child of five."]
    bodies = [{"messages": [{"role": "user", "content": p}], "max_tokens": 8 + 5 * i, "logprobs": True,
               "return_token_ids": True, "temperature": [0.0, 0.7, 1.0, 1.3][i], "n": 1 + i % 2, "seed": i}
              for i, p in enumerate(prompts)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        outs = list(pool.map(lambda b: chat(client, **b), bodies))
    worst = 0.0
    for body, out in zip(bodies, outs, strict=True):
        assert len(out["choices"]) == body["n"]
        for ch in out["choices"]:
            got = torch.tensor([c["logprob"] for c in ch["logprobs"]["content"]])
            ref = fresh_logprobs(reference, out["prompt_token_ids"], ch["token_ids"], body["temperature"])
            worst = max(worst, float((got - ref).abs().max()))
    assert worst <= 1e-4


def test_greedy_in_a_busy_batch_equals_greedy_alone(client: httpx.Client) -> None:
    alone = chat(client, max_tokens=12, temperature=0, return_token_ids=True)["choices"][0]["token_ids"]
    noise = [{"messages": [{"role": "user", "content": "noise " * (i + 1)}], "max_tokens": 20, "temperature": 1.0}
             for i in range(5)]
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(chat, client, **b) for b in noise]
        busy = chat(client, max_tokens=12, temperature=0, return_token_ids=True)["choices"][0]["token_ids"]
        [f.result() for f in futures]
    assert busy == alone


def test_seed_reproduces_and_choices_differ(client: httpx.Client) -> None:
    a = chat(client, max_tokens=10, n=3, seed=7, return_token_ids=True)
    b = chat(client, max_tokens=10, n=3, seed=7, return_token_ids=True)
    ids_a = [c["token_ids"] for c in a["choices"]]
    assert ids_a == [c["token_ids"] for c in b["choices"]]
    assert len({tuple(x) for x in ids_a}) == 3


def test_top_k_one_is_greedy_with_unchanged_logprobs(client: httpx.Client) -> None:
    greedy = chat(client, max_tokens=8, temperature=0, logprobs=True)["choices"][0]
    topk = chat(client, max_tokens=8, temperature=1.0, top_k=1, top_p=0.5, logprobs=True, seed=3)["choices"][0]
    assert topk["message"]["content"] == greedy["message"]["content"]
    lp_g = [c["logprob"] for c in greedy["logprobs"]["content"]]
    lp_k = [c["logprob"] for c in topk["logprobs"]["content"]]
    assert lp_k == pytest.approx(lp_g, abs=1e-5)  # reported at T=1 both ways; top-k does not renormalise
    assert all(lp < 0 for lp in lp_k)


def test_stop_string_cuts_text(client: httpx.Client) -> None:
    full = chat(client, max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip()
    out = chat(client, max_tokens=16, temperature=0, stop=[stop])["choices"][0]
    assert out["finish_reason"] == "stop"
    assert out["message"]["content"] == full[: full.find(stop)]


def test_completions_with_text_and_token_prompts(server: RunningPolicyServer, client: httpx.Client) -> None:
    r = client.post("/completions", json={"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0,
                                          "logprobs": 2, "return_token_ids": True})
    assert r.status_code == 200, r.text
    out = r.json()
    ch = out["choices"][0]
    lp = ch["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ch["token_ids"]) == 5
    assert all(len(t) == 2 for t in lp["top_logprobs"])
    assert ch["text"] == "".join(lp["tokens"])
    by_ids = client.post("/completions", json={"prompt": out["prompt_token_ids"], "max_tokens": 5,
                                               "temperature": 0, "return_token_ids": True}).json()
    assert by_ids["choices"][0]["token_ids"] == ch["token_ids"]
    default = client.post("/completions", json={"prompt": "x", "ignore_eos": True}).json()
    assert default["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens for completions


def test_streaming_chat_matches_non_streaming(client: httpx.Client) -> None:
    body = {"messages": MSG, "max_tokens": 9, "temperature": 0, "logprobs": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    full = chat(client, **body)
    events = sse_events(client, "/chat/completions", body)
    assert events[-1] == {"done": True}
    first = events[0]
    assert first["prompt_token_ids"] == full["prompt_token_ids"]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    ids, text, lps, finish = [], "", [], None
    for ev in events[1:-1]:
        assert ev["object"] == "chat.completion.chunk" and "policy_version" in ev
        for ch in ev["choices"]:
            ids += ch.get("token_ids") or []
            text += ch["delta"].get("content") or ""
            lps += [c["logprob"] for c in (ch.get("logprobs") or {}).get("content", [])]
            finish = ch["finish_reason"] or finish
    ref = full["choices"][0]
    assert ids == ref["token_ids"] and text == ref["message"]["content"] and finish == "length"
    assert lps == pytest.approx([c["logprob"] for c in ref["logprobs"]["content"]], abs=1e-5)
    assert events[-2]["usage"]["completion_tokens"] == 9


def test_streaming_completions_with_n(client: httpx.Client) -> None:
    events = sse_events(client, "/completions", {"prompt": "abc", "max_tokens": 4, "n": 2, "seed": 1,
                                                 "return_token_ids": True, "logprobs": True})
    assert "prompt_token_ids" in events[0]
    per_choice: dict[int, list[int]] = {0: [], 1: []}
    for ev in events[1:-1]:
        for ch in ev["choices"]:
            per_choice[ch["index"]] += ch.get("token_ids") or []
            if ch.get("token_ids"):
                assert len(ch["logprobs"]["token_logprobs"]) == 1
    assert [len(v) for v in per_choice.values()] == [4, 4]


def test_models_and_health(server: RunningPolicyServer, client: httpx.Client) -> None:
    models = client.get("/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-random"]
    assert models["data"][0]["max_model_len"] == 2048
    deadline = time.monotonic() + 5  # rows of earlier requests leave right after their last event
    while (health := httpx.get(server.url + "/health").json())["running"] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert health["status"] == "ok" and health["running"] == 0 and health["model"] == "tiny-random"


TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tools_go_through_a_template_that_supports_them() -> None:
    loaded = load_model("tiny-random")
    loaded.tokenizer.chat_template = TOOLS_TEMPLATE
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with start_policy_server(loaded) as s:
        r = httpx.post(s.base_url + "/chat/completions", timeout=60, json={
            "messages": MSG, "tools": tools, "max_tokens": 3, "return_token_ids": True})
    assert r.status_code == 200, r.text
    prompt = loaded.tokenizer.decode(r.json()["prompt_token_ids"])
    assert prompt.startswith("<|im_start|>system\nTools: ") and "get_weather" in prompt


def test_hermes_tool_calls_are_parsed_out_of_the_text() -> None:
    from rllm_serve.responses import parse_tool_calls

    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_requests_beyond_max_batch_size_wait_their_turn() -> None:
    with start_policy_server(load_model("tiny-random"), max_batch_size=2) as s, \
            httpx.Client(base_url=s.base_url, timeout=60) as c, ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: chat(c, max_tokens=5 + i, n=1 + i % 2, ignore_eos=True), range(6)))
    assert [sum(ch["finish_reason"] == "length" for ch in o["choices"]) for o in outs] == [1, 2, 1, 2, 1, 2]


def test_public_surface() -> None:
    import rllm_serve as serving

    assert sorted(serving.__all__) == ["LoadedModel", "RunningPolicyServer", "load_model", "start_policy_server"]
    assert all(getattr(serving, name) for name in serving.__all__)


def test_streamed_text_never_leaks_the_stop_string(client: httpx.Client) -> None:
    full = chat(client, max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    stop = full[len(full) // 2: len(full) // 2 + 4]
    events = sse_events(client, "/chat/completions", {"messages": MSG, "max_tokens": 16, "temperature": 0,
                                                      "stop": stop})
    text = "".join(ch["delta"].get("content") or "" for ev in events[1:-1] for ch in ev["choices"])
    assert text == full[: full.find(stop)] and stop not in text


def test_set_threads_applies_between_steps_and_returns_to_the_engines_own(server: RunningPolicyServer,
                                                                          client: httpx.Client) -> None:
    """Asynchronous RL lends the trainer cores for the length of an update: the engine thread takes the new
    count at its next step and goes back to its own when told, answering exactly as before either way."""
    engine = server.engine
    own = engine._own_threads
    before = chat(client, max_tokens=4, temperature=0, logprobs=True)
    engine.set_threads(2 if own == 1 else 1)
    during = chat(client, max_tokens=4, temperature=0, logprobs=True)
    assert engine._threads_now == (2 if own == 1 else 1)
    engine.set_threads(None)
    chat(client, max_tokens=2)
    assert engine._threads_now == own
    assert during["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
