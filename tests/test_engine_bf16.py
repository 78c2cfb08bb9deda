"""A bf16 model on the CPU serves on the fast path: the compiled attention kernel over an fp32 KV pool and the
packed bf16 linear layers, with a seeded request the same bits alone and batched, and logprobs close to a plain
bf16 forward (which rounds its attention to bf16 where the engine keeps fp32, so not the same bits)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from test_engine_paged import check_seeded_alone_and_batched, fresh_logprobs, submit

from rllm_serve import load_model
from rllm_serve.attention_kernel import kernel_available, kv_dtype
from rllm_serve.engine import DecodeEngine
from rllm_serve.fast_forward import fast_forward
from rllm_serve.models import LoadedModel

pytestmark = pytest.mark.skipif(not kernel_available(torch.float32, torch.device("cpu")),
                                reason="numba is not installed (rllm[serve]): the bf16 fast path needs its kernel")


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    torch.set_num_threads(1)
    return load_model("tiny-random", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def reference(loaded: LoadedModel) -> torch.nn.Module:
    return copy.deepcopy(loaded.model)


@pytest.fixture(scope="module")
def engine(loaded: LoadedModel, reference: torch.nn.Module) -> Iterator[DecodeEngine]:
    eng = DecodeEngine(loaded, threads=1).start()
    yield eng
    eng.stop()


def test_half_precision_models_keep_an_fp32_pool_on_the_cpu_only() -> None:
    cpu = torch.device("cpu")
    assert kv_dtype(torch.bfloat16, cpu) == torch.float32 and kv_dtype(torch.float16, cpu) == torch.float32
    assert kv_dtype(torch.float32, cpu) == torch.float32
    assert kv_dtype(torch.bfloat16, torch.device("cuda")) == torch.bfloat16


def test_a_bf16_model_serves_on_the_kernel_with_packed_weights(engine: DecodeEngine, loaded: LoadedModel,
                                                                 reference: torch.nn.Module) -> None:
    assert engine.pool.keys[0].dtype == torch.float32
    prompt = list(range(100, 160))
    job = submit(engine, prompt, n=2, max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
    assert job.done.wait(60)
    assert fast_forward(engine.model) is not None  # the packed bf16 layers and the kernel ran the step
    exact = copy.deepcopy(reference).float()  # the bf16 weights, computed in fp32: what rounding departs from
    for c in range(2):
        ideal = fresh_logprobs(exact, prompt, job.tokens(c))
        ours = (torch.tensor(job.logprobs(c)) - ideal).abs().mean().item()
        plain = (fresh_logprobs(reference, prompt, job.tokens(c)) - ideal).abs().mean().item()
        assert ours <= plain, (ours, plain)  # no further from the exact numbers than a plain bf16 forward


def test_a_seeded_bf16_request_is_the_same_bits_alone_and_batched(engine: DecodeEngine) -> None:
    check_seeded_alone_and_batched(engine, list(range(300, 370)), n=2, seed=7)


def test_the_default_dtype_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm_core import cpu_features
    from rllm_serve.models import default_dtype

    monkeypatch.setattr(cpu_features, "native_bf16", lambda: True)
    assert default_dtype("cpu")[0] == (torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported()
                                       else torch.float32)
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)
    assert default_dtype("cpu") == (torch.float32, "this CPU has no bf16 matmul instructions")
    assert cpu_features.matmul_flags()  # printed beside every figure


def test_the_local_backend_samples_from_a_bf16_server_and_logs_the_mismatch(tmp_path) -> None:
    """backend_options server_dtype bfloat16: the server's copy is bf16 (the trainer's stays fp32), a sync casts
    the trainer's weights into it, and train/mismatch_kl measures the gap the faster sampler opens."""
    from rllm_backends.local_torch.backend import LocalTorchBackend
    from rllm_testing.backend_contract import sample_rows
    from rllm_train.config import TrainConfig

    config = TrainConfig(model="tiny-random", output=str(tmp_path / "run"), lr=1e-3, bf16=False,
                         backend_options={"server_dtype": "bfloat16"})
    backend = LocalTorchBackend()
    backend.setup(config)
    try:
        assert backend.server.engine.model.dtype == torch.bfloat16
        assert next(backend.trainer.model.parameters()).dtype == torch.float32
        metrics = backend.train_step(sample_rows(backend, n=4, max_tokens=6))
        assert metrics["train/mismatch_k3_kl"] > 0  # bf16 sampling against an fp32 trainer: not the same numbers
        assert backend.sync_weights() == 1
        assert len(sample_rows(backend, n=2, max_tokens=4)) == 2  # it serves the trainer's weights, cast
    finally:
        backend.shutdown()
