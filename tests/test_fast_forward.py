"""The engine's own Llama forward: which models take it, that the engine uses it, and that the model's
transformers forward still gives the same numbers once its q|k|v and gate|up weights are packed together."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from rllm_serve import load_model
from rllm_serve.attention_kernel import kernel_available
from rllm_serve.engine import DecodeEngine
from rllm_serve.fast_forward import GATE_UP, QKV, FastForward, fast_forward, fusions
from rllm_serve.packed_linear import pack_linear_layers, packing_available
from rllm_serve.sampling import SamplingParams
from rllm_serve.sequence import GenerationRequest, TokenEvent

pytestmark = pytest.mark.skipif(not (packing_available() and kernel_available(torch.float32, torch.device("cpu"))),
                                reason="needs oneDNN and numba")


def test_only_a_plain_llama_takes_the_fast_forward() -> None:
    peft = pytest.importorskip("peft")
    model = load_model("tiny-random").model
    assert len(fusions(model)) == 2 * model.config.num_hidden_layers
    assert fast_forward(model) is None  # nothing packed yet
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, target_modules="all-linear"))
    assert fusions(lora) == []
    model.config.attention_bias = True  # biased projections: transformers' forward
    assert fusions(model) == []
    model.config.attention_bias = False
    model.config.hidden_act = "gelu"
    assert fusions(model) == []


@pytest.mark.parametrize("release", [False, True])
def test_the_transformers_forward_is_unchanged_by_fused_packing(release: bool) -> None:
    model = load_model("tiny-random").model
    ids = torch.tensor([[5, 17, 300, 41, 9, 77]])
    with torch.inference_mode():
        before = model(ids).logits
    packed = pack_linear_layers(model, head_rows=64, release_dense=release, fusions=fusions(model))
    layer = model.model.layers[0]
    assert hasattr(layer, QKV) and hasattr(layer, GATE_UP) and fast_forward(model) is not None
    assert getattr(layer.self_attn.q_proj, "_rllm_packed", None) is None  # packed once, inside q|k|v
    assert layer.self_attn.q_proj.weight.is_meta == release
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, before, atol=1e-5)
    # a swap of one fused part: the others are read back, the fused weight repacked once
    gen = torch.Generator().manual_seed(0)
    key = "model.layers.0.self_attn.k_proj.weight"
    new = torch.randn(layer.self_attn.k_proj.weight.shape, generator=gen)
    own = model.state_dict()
    with torch.no_grad():
        packed.update(key, own[key], new)
        packed.finish()
    reference = load_model("tiny-random").model
    reference.model.layers[0].self_attn.k_proj.weight.data.copy_(new)
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-5)


def test_the_engine_serves_a_llama_through_the_fast_forward_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = FastForward.__call__

    def counted(self: FastForward, *args: object) -> torch.Tensor:
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(FastForward, "__call__", counted)
    loaded = load_model("tiny-random")
    reference = copy.deepcopy(loaded.model)
    engine = DecodeEngine(loaded, threads=1).start()
    events: list[TokenEvent] = []
    done = threading.Event()

    def sink(ev: TokenEvent) -> None:
        events.append(ev)
        if ev.finish_reason is not None:
            done.set()

    prompt = list(range(40, 110))
    try:
        engine.submit(GenerationRequest(prompt, SamplingParams(max_tokens=12, ignore_eos=True), sink))
        assert done.wait(60)
        assert fast_forward(engine.model) is not None and len(calls) >= 12  # every step took it
    finally:
        engine.stop()
    toks = [e.token_id for e in events if e.token_id is not None]
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + toks])).logits[0, len(prompt) - 1: -1]
    ref = torch.log_softmax(logits, -1)[torch.arange(len(toks)), toks]
    got = torch.tensor([e.logprob for e in events if e.token_id is not None])
    assert float((ref - got).abs().max()) < 1e-4
