"""The shared backend contract (rllm_testing.backend_contract) run against our backends: the local torch
backend on tiny-random, the recording double over one upstream, and over two replicas with a Future-returning
train_step. A third-party backend runs the same suite by subclassing BackendContract."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm_testing.backend_contract import BackendContract
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_train.backend import Backend
from rllm_train.config import TrainConfig


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    with start_fake_upstream() as a, start_fake_upstream() as b:
        yield a, b


@pytest.mark.slow
class TestLocalTorchBackend(BackendContract):
    def make_backend(self, tmp_path: Path) -> tuple[Backend, TrainConfig]:
        from rllm_backends.local_torch.backend import LocalTorchBackend

        config = TrainConfig(model="tiny-random", temperature=0.7, max_tokens=6, lr=1e-3, max_steps=4,
                             output=str(tmp_path / "run"))
        return LocalTorchBackend(), config


class TestRecordingBackend(BackendContract):
    @pytest.fixture(autouse=True)
    def _upstream(self, upstreams: tuple[FakeUpstream, FakeUpstream]) -> None:
        self.upstreams = upstreams

    def make_backend(self, tmp_path: Path) -> tuple[Backend, TrainConfig]:
        return RecordingBackend(self.upstreams[0].base_url), TrainConfig(max_tokens=6)


class TestRecordingBackendAsyncReplicas(TestRecordingBackend):
    def make_backend(self, tmp_path: Path) -> tuple[Backend, TrainConfig]:
        a, b = self.upstreams
        return RecordingBackend(a.base_url, asynchronous=True, replicas=[a.base_url, b.base_url]), TrainConfig(
            max_tokens=6)
