"""One policy per role: a peft model with LoRA adapters "judge" and "solver" served at once, `model` picking one.

Every check compares against a reference copy of the same PeftModel run on its own (`set_adapter`, or
`disable_adapter()` for the base), so "the right adapter served it" means "the numbers are that adapter's".
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import httpx
import pytest
import torch

from rllm_core.errors import ConfigError
from rllm_serve import LoadedModel, RunningPolicyServer, load_model, start_policy_server
from rllm_serve.engine import DecodeEngine
from rllm_serve.models import lora_adapters
from rllm_serve.sampling import SamplingParams
from rllm_serve.sequence import GenerationRequest

peft = pytest.importorskip("peft")

BASE = "tiny-random"
ADAPTERS = ["judge", "solver"]
MSG = [{"role": "user", "content": "Is this proof right?"}]


def lora_config(**kw: Any) -> Any:
    return peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj",
                                                                                   "up_proj", "down_proj"], **kw)


def build_peft(**kw: Any) -> LoadedModel:
    """tiny-random with adapters judge and solver, their LoRA B set to different random values (peft inits 0)."""
    loaded = load_model(BASE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(loaded.model, lora_config(**kw), adapter_name="judge")
        model.add_adapter("solver", lora_config(**kw))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    loaded.model = model.eval()
    return loaded


@pytest.fixture(scope="module")
def reference() -> LoadedModel:
    torch.set_num_threads(1)
    return build_peft()


def serve(reference: LoadedModel, **kw: Any) -> RunningPolicyServer:
    """A server over its own deep copy (the trainer hands the server a copy too)."""
    return start_policy_server(LoadedModel(copy.deepcopy(reference.model), reference.tokenizer, BASE), **kw)


@pytest.fixture(scope="module")
def server(reference: LoadedModel) -> Iterator[RunningPolicyServer]:
    with serve(reference, max_batch_size=16) as s:
        yield s


def chat(server: RunningPolicyServer, model: str, **body: Any) -> dict[str, Any]:
    body = {"messages": MSG, "model": model, "max_tokens": 12, "temperature": 0, "logprobs": True,
            "return_token_ids": True, "ignore_eos": True, **body}
    r = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def served_logprobs(out: dict[str, Any]) -> torch.Tensor:
    return torch.tensor([c["logprob"] for c in out["choices"][0]["logprobs"]["content"]])


def own_logprobs(reference: LoadedModel, adapter: str | None, out: dict[str, Any]) -> torch.Tensor:
    """The completion's logprobs from one forward pass of the reference with only `adapter` on (None: base)."""
    prompt, ids = out["prompt_token_ids"], out["choices"][0]["token_ids"]
    model = reference.model
    if adapter is not None:
        model.set_adapter(adapter)
    with torch.no_grad(), model.disable_adapter() if adapter is None else nullcontext():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
    return lp[torch.arange(len(ids)), torch.tensor(ids)]


def record_adapter_batches(server: RunningPolicyServer) -> tuple[list[list[str]], Any]:
    """Every forward pass's `adapter_names` (one per batch row) as the engine hands them to peft."""
    seen: list[list[str]] = []

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(list(kwargs["adapter_names"]))

    return seen, server.engine.model.register_forward_pre_hook(hook, with_kwargs=True)


def test_models_lists_the_base_and_every_adapter(server: RunningPolicyServer) -> None:
    assert server.adapters == ADAPTERS
    data = httpx.get(server.base_url + "/models").json()["data"]
    assert [m["id"] for m in data] == [BASE, *ADAPTERS]
    assert {m["max_model_len"] for m in data} == {server.loaded.context_length}
    assert [m.get("parent") for m in data] == [None, BASE, BASE]
    health = httpx.get(server.url + "/health").json()
    assert health["adapters"] == ADAPTERS and health["default_adapter"] is None


def test_one_mixed_batch_serves_each_request_with_its_own_adapter(server: RunningPolicyServer,
                                                                  reference: LoadedModel) -> None:
    names = ["judge", "solver", BASE]
    seen, handle = record_adapter_batches(server)
    try:
        with ThreadPoolExecutor(3) as pool:
            outs = list(pool.map(lambda m: chat(server, m, max_tokens=48), names))
    finally:
        handle.remove()
    assert any(set(rows) == {"judge", "solver", "__base__"} for rows in seen), "the three never shared a batch"
    assert [o["model"] for o in outs] == names
    tokens = [o["choices"][0]["token_ids"] for o in outs]
    assert len({tuple(t) for t in tokens}) == 3, "greedy outputs should differ between adapters"
    for name, out in zip(names, outs, strict=True):
        ref = own_logprobs(reference, None if name == BASE else name, out)
        assert float((served_logprobs(out) - ref).abs().max()) <= 1e-4, name
    # and each adapter's logprobs are those of its own weights only: the others' forward passes disagree
    judge = own_logprobs(reference, "solver", outs[0])
    assert float((served_logprobs(outs[0]) - judge).abs().max()) > 1e-2


def test_a_seeded_request_gets_the_same_bits_alone_and_in_a_mixed_batch(server: RunningPolicyServer) -> None:
    """The batch-invariant kernels cover peft's per-adapter LoRA products: mixing changes no bit (CPU)."""
    assert server.engine.batch_invariant
    seeded = {"temperature": 1.0, "seed": 11, "max_tokens": 24}
    alone = chat(server, "judge", **seeded)
    with ThreadPoolExecutor(4) as pool:
        others = [pool.submit(chat, server, m, max_tokens=40) for m in ("solver", BASE, "solver")]
        mixed = pool.submit(chat, server, "judge", **seeded).result()
        [f.result() for f in others]
    assert mixed["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]
    assert served_logprobs(mixed).tolist() == served_logprobs(alone).tolist()


def test_unknown_model_names_get_the_default_adapter(server: RunningPolicyServer, reference: LoadedModel) -> None:
    base = chat(server, BASE)
    unknown = chat(server, "gpt-9")
    assert unknown["model"] == BASE and served_logprobs(unknown).tolist() == served_logprobs(base).tolist()
    with serve(reference, default_adapter="judge") as s:
        judge, fallback, named_base = chat(s, "judge"), chat(s, "gpt-9"), chat(s, BASE)
        assert s.default_adapter == "judge" and fallback["model"] == BASE
    assert fallback["choices"][0]["token_ids"] == judge["choices"][0]["token_ids"]
    assert float((served_logprobs(fallback) - own_logprobs(reference, "judge", fallback)).abs().max()) <= 1e-4
    assert float((served_logprobs(named_base) - own_logprobs(reference, "judge", named_base)).abs().max()) <= 1e-4


def test_bad_default_adapter_and_adapter_names_are_refused(reference: LoadedModel) -> None:
    with pytest.raises(ConfigError, match="default_adapter 'critic' is not an adapter"):
        serve(reference, default_adapter="critic")
    with pytest.raises(ConfigError, match="plain model"):
        start_policy_server(load_model(BASE), default_adapter="judge")
    clash = LoadedModel(copy.deepcopy(reference.model), reference.tokenizer, "judge")
    with pytest.raises(ConfigError, match="adapter is named 'judge'"):
        start_policy_server(clash)
    engine = DecodeEngine(LoadedModel(copy.deepcopy(reference.model), reference.tokenizer, BASE))
    with pytest.raises(ConfigError, match="adapter 'critic' is not served"):
        engine.submit(GenerationRequest([1, 2], SamplingParams(max_tokens=1), lambda ev: None, adapter="critic"))


def test_merged_or_dora_adapters_are_refused_up_front(reference: LoadedModel) -> None:
    merged = copy.deepcopy(reference.model)
    merged.merge_adapter()
    with pytest.raises(ConfigError, match="merged adapters"):
        lora_adapters(merged)
    with pytest.raises(ConfigError, match="DoRA"):
        lora_adapters(build_peft(use_dora=True).model)
    assert lora_adapters(load_model(BASE).model) == []


def test_update_weights_with_one_adapters_lora_tensors(reference: LoadedModel) -> None:
    with serve(reference) as s:
        before = {m: chat(s, m) for m in ("judge", "solver", BASE)}
        gen = torch.Generator().manual_seed(5)
        own = s.loaded.model.state_dict()
        judge_lora = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in own.items()
                      if ".lora_A.judge." in k or ".lora_B.judge." in k}
        assert judge_lora and len(judge_lora) < len(own)
        assert s.update_weights(judge_lora) == 1
        after = {m: chat(s, m) for m in ("judge", "solver", BASE)}
        with pytest.raises(ConfigError, match=r"lora_A.<adapter>.weight"):  # get_peft_model_state_dict's names
            s.update_weights({k.replace(".judge.", "."): v for k, v in judge_lora.items()})
    assert all(a["policy_version"] == 1 for a in after.values())
    assert served_logprobs(after["judge"]).tolist() != served_logprobs(before["judge"]).tolist()
    for m in ("solver", BASE):
        assert after[m]["choices"][0]["token_ids"] == before[m]["choices"][0]["token_ids"]
        assert served_logprobs(after[m]).tolist() == served_logprobs(before[m]).tolist()
    updated = LoadedModel(copy.deepcopy(reference.model), reference.tokenizer, BASE)
    updated.model.load_state_dict(judge_lora, strict=False)
    got = own_logprobs(updated, "judge", after["judge"])
    assert float((served_logprobs(after["judge"]) - got).abs().max()) <= 1e-4


def test_every_endpoint_picks_the_adapter(server: RunningPolicyServer) -> None:
    """Routing is by `model` on every endpoint: completions (n=2), responses and a streamed chat give the
    adapter's greedy tokens, and report the adapter as the model."""
    prompt = chat(server, "solver")["prompt_token_ids"]
    r = httpx.post(server.base_url + "/completions", timeout=60, json={
        "model": "solver", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True, "n": 2})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "solver"
    solver = chat(server, "solver")["choices"][0]["token_ids"]
    assert [c["token_ids"] for c in r.json()["choices"]] == [solver, solver]  # n choices share the adapter
    judge_text = chat(server, "judge")["choices"][0]["message"]["content"]
    r = httpx.post(server.base_url + "/responses", timeout=60, json={
        "model": "judge", "input": MSG[0]["content"], "max_output_tokens": 12, "temperature": 0,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "judge" and r.json()["output"][-1]["content"][0]["text"] == judge_text
    chunks = []
    with httpx.stream("POST", server.base_url + "/chat/completions", timeout=60, json={
            "model": "judge", "messages": MSG, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "stream": True}) as resp:
        assert resp.status_code == 200
        chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert {c["model"] for c in chunks} == {"judge"}
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert streamed == judge_text
