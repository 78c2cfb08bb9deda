"""The `local` backend with the real policy server (tiny-random): the server's logprobs equal the trainer's
recomputed ones (first ratio = 1) before and after a weight sync, LoRA sync, and the registered plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rllm_backends.local_torch.backend import LocalTorchBackend
from rllm_backends.local_torch.logprobs import collate, sequence_logprobs
from rllm_core.errors import ConfigError
from rllm_train.backend import Backend, create_backend
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

TEMP = 0.7


def _cfg(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"model": "tiny-random", "temperature": TEMP, "max_tokens": 8, "lr": 1e-2,
                            "micro_batch_size": 8, "max_steps": 10}
    base.update(kw)
    return TrainConfig(**base)


def _sample(backend: LocalTorchBackend, n: int = 4) -> tuple[list[TrainRow], int]:
    ep = backend.policy_endpoint()
    body = {"model": ep.model, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "n": n,
            "temperature": TEMP, "max_tokens": 8, "logprobs": True, "return_token_ids": True}
    data = httpx.post(f"{ep.base_url}/chat/completions", json=body, timeout=60).json()
    prompt = data["prompt_token_ids"]
    rows = []
    for i, choice in enumerate(data["choices"]):
        ids = choice["token_ids"]
        lps = [t["logprob"] for t in choice["logprobs"]["content"]]
        adv = 1.0 if i % 2 == 0 else -1.0
        rows.append(TrainRow(tokens=prompt + ids, loss_mask=[0] * len(prompt) + [1] * len(ids),
                             sampling_logprobs=[0.0] * len(prompt) + lps,
                             advantages=[0.0] * len(prompt) + [adv] * len(ids), policy_version=data["policy_version"]))
    return rows, int(data["policy_version"])


@torch.no_grad()
def _max_logprob_gap(backend: LocalTorchBackend, rows: list[TrainRow]) -> float:
    model = backend.trainer.model
    ids = collate([r.tokens for r in rows], 0, torch.long, "cpu")
    attn = collate([[1] * len(r.tokens) for r in rows], 0, torch.long, "cpu")
    mask = collate([r.loss_mask for r in rows], 0, torch.float32, "cpu")[:, 1:]
    old = collate([r.sampling_logprobs for r in rows], 0.0, torch.float32, "cpu")[:, 1:]
    new, _ = sequence_logprobs(model, ids, attn, TEMP)
    return float(((new - old).abs() * mask).max())


@pytest.mark.slow
def test_server_logprobs_match_trainer_before_and_after_sync() -> None:
    backend = LocalTorchBackend()
    backend.setup(_cfg())
    try:
        rows, version = _sample(backend)
        assert version == 0
        assert _max_logprob_gap(backend, rows) < 1e-4
        metrics = backend.train_step(rows)
        assert metrics["train/approx_kl"] == pytest.approx(0.0, abs=1e-5) and metrics["train/clip_frac"] == 0.0
        assert backend.sync_weights() == 1
        rows2, version2 = _sample(backend)
        assert version2 == 1  # the server now samples from the updated weights...
        assert _max_logprob_gap(backend, rows2) < 1e-4  # ...which are exactly the trainer's
        assert _max_logprob_gap(backend, rows) > 1e-3  # and they did change
    finally:
        backend.shutdown()


@pytest.mark.slow
def test_lora_weights_are_merged_into_the_server() -> None:
    backend = LocalTorchBackend()
    backend.setup(_cfg(lora_rank=4, lr=5e-2))
    try:
        rows, _ = _sample(backend)
        backend.train_step(rows)
        backend.sync_weights()
        rows2, _ = _sample(backend)
        assert _max_logprob_gap(backend, rows2) < 1e-4
    finally:
        backend.shutdown()


@pytest.mark.slow
def test_save_then_load_serves_the_saved_weights(tmp_path: Path) -> None:
    first = LocalTorchBackend()
    first.setup(_cfg())
    try:
        rows, _ = _sample(first)
        first.train_step(rows)
        first.sync_weights()
        first.save(tmp_path)
        rows2, _ = _sample(first)  # sampled from the saved weights
        first.train_step(rows2)  # the trainer moves on; the checkpoint must not
    finally:
        first.shutdown()
    resumed = LocalTorchBackend()
    resumed.setup(_cfg())
    try:
        assert _max_logprob_gap(resumed, rows2) > 1e-3  # a fresh model differs...
        resumed.load(tmp_path)
        assert _max_logprob_gap(resumed, rows2) < 1e-4  # ...the loaded trainer has the saved weights
        assert resumed.trainer.step == 1
        rows3, _ = _sample(resumed)  # and the server samples from them at once
        assert _max_logprob_gap(resumed, rows3) < 1e-4
    finally:
        resumed.shutdown()


@pytest.mark.parametrize(("device", "message"), [("cuda:99", "CUDA GPU"), ("potato", "not a torch device"),
                                               ("meta", "cpu or one CUDA GPU")])
def test_bad_device_is_a_config_error_before_loading(device: str, message: str) -> None:
    backend = LocalTorchBackend()
    with pytest.raises(ConfigError, match=message):
        backend.setup(_cfg(device=device))
    assert backend.server is None


def test_local_backend_is_registered() -> None:
    backend = create_backend("local", _cfg())
    assert isinstance(backend, Backend) and backend.name == "local"
    backend.shutdown()  # never set up: a no-op


def test_the_server_drops_its_weights_during_the_update_and_a_failed_step_gives_them_back() -> None:
    """The server's packed copy is not held while the trainer updates (the update's peak memory); after a step
    that raised, the server serves the unchanged weights at the unchanged version."""
    from rllm_core.errors import TrainingError
    from rllm_serve.packed_linear import packing_available, packs_released

    backend = LocalTorchBackend()
    backend.setup(_cfg())
    try:
        rows, _ = _sample(backend)
        engine = backend.server.engine
        seen: list[int] = []
        original = backend.trainer.train_step

        def spy(batch: list[TrainRow]) -> dict[str, float]:
            seen.append(packs_released(engine.runner.packed))
            return original(batch)

        backend.trainer.train_step = spy  # type: ignore[method-assign]
        backend.train_step(rows)
        assert (seen[0] > 0) == packing_available()
        assert backend.sync_weights() == 1 and packs_released(engine.runner.packed) == 0
        silent = [r.model_copy(update={"loss_mask": [0] * len(r.tokens)}) for r in rows]
        with pytest.raises(TrainingError, match="no trainable tokens"):
            backend.train_step(silent)
        assert packs_released(engine.runner.packed) == 0 and backend.server.policy_version == 1
        rows2, version = _sample(backend)
        assert version == 1 and _max_logprob_gap(backend, rows2) < 1e-4
    finally:
        backend.shutdown()
