"""Shared fixtures: the deterministic upstream, a clean plugin manager."""

from __future__ import annotations

import os

import rllm_core.cpu_runtime  # noqa: F401  (bounds OpenMP spinning and the oneDNN cache before torch loads)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local test clusters on 127.0.0.1 need no token

from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def fake_upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream() as up:
        yield up


@pytest.fixture
def shared_data_dir() -> Path:
    """../shared/data (the benchmark data kept beside the checkout); tests that need it fail loudly without it."""
    path = Path(os.environ.get("RLLM_DATA_DIR", SHARED_DATA))
    assert path.is_dir(), f"benchmark data not found at {path}; set RLLM_DATA_DIR to the shared data folder"
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (word-level) Hugging Face tokenizer with a chat template, built offline in a temp folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "</s>", "<|user|>", "<|assistant|>", "ok:", "hello", "there", "2+2="]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path
