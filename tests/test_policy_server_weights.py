"""Weights in, versions out: in-process weight swaps, what in-flight requests see, and bad state dicts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import torch

from rllm_core.errors import ConfigError
from rllm_serve import RunningPolicyServer, load_model, start_policy_server

MSG = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture
def server() -> Iterator[RunningPolicyServer]:
    torch.set_num_threads(1)
    with start_policy_server(load_model("tiny-random")) as s:
        yield s


def greedy(server: RunningPolicyServer, max_tokens: int = 8) -> dict:
    r = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "messages": MSG, "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()


def perturbed(server: RunningPolicyServer, scale: float = 0.5) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in server.loaded.model.state_dict().items()}


def test_update_weights_bumps_version_and_changes_outputs(server: RunningPolicyServer) -> None:
    before = greedy(server)
    assert before["policy_version"] == 0
    new_sd = perturbed(server)
    assert server.update_weights(new_sd) == 1 == server.policy_version
    after = greedy(server)
    assert after["policy_version"] == 1
    assert after["choices"][0]["logprobs"] != before["choices"][0]["logprobs"]
    # the served numbers are those of the new weights: a fresh model loaded with new_sd reproduces them
    fresh = load_model("tiny-random").model
    fresh.load_state_dict(new_sd)
    ids = after["choices"][0]["token_ids"]
    with torch.no_grad():
        logits = fresh(torch.tensor([after["prompt_token_ids"] + ids])).logits[0].float()
    ref = torch.log_softmax(logits[len(after["prompt_token_ids"]) - 1:-1], -1)[torch.arange(len(ids)), ids]
    got = torch.tensor([c["logprob"] for c in after["choices"][0]["logprobs"]["content"]])
    assert float((got - ref).abs().max()) <= 1e-4
    health = httpx.get(server.url + "/health").json()
    assert health["policy_version"] == 1


def served_logprobs_match(reply: dict, weights: dict[str, torch.Tensor]) -> None:
    """The reply's logprobs are those of a fresh tiny-random model loaded with `weights` (within 1e-4)."""
    fresh = load_model("tiny-random").model
    fresh.load_state_dict(weights)
    prompt, ids = reply["prompt_token_ids"], reply["choices"][0]["token_ids"]
    with torch.no_grad():
        logits = fresh(torch.tensor([prompt + ids])).logits[0].float()
    ref = torch.log_softmax(logits[len(prompt) - 1:-1], -1)[torch.arange(len(ids)), ids]
    got = torch.tensor([c["logprob"] for c in reply["choices"][0]["logprobs"]["content"]])
    assert float((got - ref).abs().max()) <= 1e-4


def test_a_server_that_owns_its_model_keeps_one_copy_of_the_weights_and_swaps_them() -> None:
    from rllm_serve.packed_linear import packing_available

    torch.set_num_threads(1)
    base = load_model("tiny-random").model.state_dict()
    with start_policy_server("tiny-random") as s:  # loaded by the server: it owns the model
        served_logprobs_match(greedy(s), base)
        q_proj = s.engine.model.model.layers[0].self_attn.q_proj
        assert q_proj.weight.is_meta == packing_available()  # only the packed copy is kept
        gen = torch.Generator().manual_seed(3)
        new = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
        assert s.update_weights(new) == 1
        served_logprobs_match(greedy(s), new)
        key = "model.layers.0.self_attn.q_proj.weight"
        assert s.update_weights({key: base[key]}) == 2  # a subset, into a released layer
        served_logprobs_match(greedy(s), {**new, key: base[key]})
    with start_policy_server(load_model("tiny-random")) as s:  # the caller's model: left as it was
        greedy(s)
        assert not s.engine.model.model.layers[0].self_attn.q_proj.weight.is_meta


def test_in_flight_request_finishes_on_the_old_weights_without_holding_up_the_swap(
        server: RunningPolicyServer) -> None:
    """No drain: the update returns while a long stream runs; the stream keeps version 0 to its end, a request
    sent after the swap is served by version 1 at the same time."""
    body = {"messages": MSG, "max_tokens": 1500, "ignore_eos": True, "stream": True, "return_token_ids": True}
    versions: list[int] = []
    stream_done = threading.Event()
    started = threading.Event()

    def read_stream() -> None:
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    versions.append(json.loads(line[6:])["policy_version"])
                    if len(versions) > 3:
                        started.set()
        stream_done.set()

    reader = threading.Thread(target=read_stream)
    reader.start()
    assert started.wait(30)
    version = server.update_weights(perturbed(server), timeout=60)
    during = greedy(server, 2)
    still_running = not stream_done.is_set()
    reader.join(120)
    assert version == 1 and during["policy_version"] == 1
    assert still_running, "the swap or the new request waited for the old stream to finish"
    assert len(versions) > 1500 and set(versions) == {0}
    assert greedy(server, 2)["policy_version"] == 1


def test_bad_state_dicts_are_refused_and_change_nothing(server: RunningPolicyServer) -> None:
    before = greedy(server)
    with pytest.raises(ConfigError, match="not parameters"):
        server.update_weights({"transformer.h.0.weight": torch.zeros(3)})
    name, value = next(iter(server.loaded.model.state_dict().items()))
    with pytest.raises(ConfigError, match="shape"):
        server.update_weights({name: torch.zeros(*value.shape[:-1], value.shape[-1] + 1)})
    assert server.policy_version == 0
    assert greedy(server)["choices"] == before["choices"]


def test_partial_state_dict_updates_only_those_weights(server: RunningPolicyServer) -> None:
    sd = server.loaded.model.state_dict()
    norm = next(k for k in sd if k.endswith("norm.weight"))
    untouched = next(k for k in sd if k.endswith("q_proj.weight"))
    keep = sd[untouched].clone()
    assert server.update_weights({norm: torch.full_like(sd[norm], 2.0)}) == 1
    assert torch.equal(server.loaded.model.state_dict()[norm], torch.full_like(sd[norm], 2.0))
    assert torch.equal(server.loaded.model.state_dict()[untouched], keep)


def test_stop_ends_in_flight_requests_promptly() -> None:
    srv = start_policy_server(load_model("tiny-random"), threads=1)
    outcome: dict[str, object] = {}

    def long_request() -> None:
        try:
            r = httpx.post(srv.base_url + "/chat/completions", timeout=30,
                           json={"messages": MSG, "max_tokens": 1900, "ignore_eos": True})
            outcome["status"] = r.status_code
        except httpx.HTTPError as exc:
            outcome["error"] = type(exc).__name__

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 10
    while httpx.get(srv.url + "/health").json()["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    srv.stop()
    t.join(10)
    assert time.monotonic() - start < 10 and not t.is_alive()
    assert outcome.get("status") == 500 or "error" in outcome
    with pytest.raises(RuntimeError, match="stopped"):
        srv.update_weights({})
    srv.stop()  # idempotent


def test_resume_mode_reports_the_version_of_every_token() -> None:
    """swap_mode="resume": a request in flight continues on the new weights; the response says which tokens
    came from which version (`token_policy_versions`, one per token id)."""
    with start_policy_server(load_model("tiny-random"), swap_mode="resume") as srv:
        out: dict = {}

        def call() -> None:
            out["r"] = httpx.post(srv.base_url + "/chat/completions", timeout=120, json={
                "messages": MSG, "max_tokens": 1200, "ignore_eos": True, "return_token_ids": True}).json()

        caller = threading.Thread(target=call)
        caller.start()
        deadline = time.monotonic() + 30
        while httpx.get(srv.url + "/health").json()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert srv.update_weights(perturbed(srv, 0.05), timeout=60) == 1
        caller.join(120)
    choice = out["r"]["choices"][0]
    versions = choice["token_policy_versions"]
    assert len(versions) == len(choice["token_ids"]) == 1200
    assert versions == sorted(versions) and set(versions) == {0, 1}


def test_released_weights_wait_for_a_full_update_and_serve_it_exactly() -> None:
    """release_weights (the local backend, while its trainer updates) drops the packed copy; a request sent then
    waits; a partial update is refused and keeps waiting; the full update serves exactly the new weights."""
    from rllm_serve.packed_linear import packing_available, packs_released

    torch.set_num_threads(1)
    base = load_model("tiny-random").model.state_dict()
    with start_policy_server("tiny-random") as s:
        if not packing_available():
            assert s.engine.release_weights() is False  # nothing packed: nothing to drop
            return
        greedy(s)
        assert s.engine.release_weights() is True and packs_released(s.engine.runner.packed) > 0
        box: dict = {}
        waiter = threading.Thread(target=lambda: box.update(reply=greedy(s)))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive()  # no weights: the request waits, it does not fail
        key = "model.layers.0.self_attn.q_proj.weight"
        with pytest.raises(ConfigError, match="must bring every weight back"):
            s.update_weights({key: base[key]})
        assert waiter.is_alive()
        gen = torch.Generator().manual_seed(5)
        new = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
        version = s.update_weights(new)
        waiter.join(60)
        assert box["reply"]["policy_version"] == version and packs_released(s.engine.runner.packed) == 0
        served_logprobs_match(box["reply"], new)
        assert s.engine.release_weights() is True
        s.update_weights(new, version=version)  # a failed trainer step restores the same weights and version
        assert s.policy_version == version
        served_logprobs_match(greedy(s), new)
