"""The backend contract: one pytest suite every training backend passes, ours and a third party's alike.

Use it from a test module of your package:

    from rllm_testing.backend_contract import BackendContract

    class TestMyBackend(BackendContract):
        def make_backend(self, tmp_path):
            config = TrainConfig(model="tiny-random", max_steps=4, max_tokens=8)
            return MyBackend(config), config

pytest then runs every `test_*` method below against it. The suite samples from the backend's own policy
endpoint (every replica, with `return_token_ids` and `logprobs`, as the gateway asks), builds train rows from
the reply, and checks the v2 seam: declared capabilities, lifecycle hooks, a train step (plain or a future)
with finite metrics, a version bump the endpoint reports, save/load round-trips, refusal of options the
backend says it cannot honour, and a shutdown that is safe twice.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rllm_core.errors import ConfigError
from rllm_train.backend import Backend, BackendCapabilities, check_capabilities, resolve_metrics
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

__all__ = ["BackendContract", "sample_rows"]


def sample_rows(backend: Backend, n: int = 4, max_tokens: int = 8, temperature: float = 1.0) -> list[TrainRow]:
    """Rows sampled from every replica of the backend's endpoint, with alternating ±1 advantages."""
    endpoint = backend.policy_endpoint()
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    rows: list[TrainRow] = []
    for url in endpoint.upstream_urls:
        body = {"model": endpoint.model, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "n": n,
                "temperature": temperature, "max_tokens": max_tokens, "logprobs": True, "return_token_ids": True}
        resp = httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=120)
        assert resp.status_code == 200, f"{url} answered HTTP {resp.status_code}: {resp.text[:300]}"
        data = resp.json()
        assert "prompt_token_ids" in data, f"{url} returned no prompt_token_ids although return_token_ids was sent"
        prompt = data["prompt_token_ids"]
        for i, choice in enumerate(data["choices"]):
            ids = choice["token_ids"]
            lps = [t["logprob"] for t in choice["logprobs"]["content"]]
            assert len(ids) == len(lps), f"{url}: {len(ids)} token ids but {len(lps)} logprobs"
            adv = 1.0 if i % 2 == 0 else -1.0
            rows.append(TrainRow(tokens=prompt + ids, loss_mask=[0] * len(prompt) + [1] * len(ids),
                                 sampling_logprobs=[0.0] * len(prompt) + lps,
                                 advantages=[0.0] * len(prompt) + [adv] * len(ids), group_id="g0",
                                 trajectory_id=f"t{len(rows)}", policy_version=data.get("policy_version"),
                                 temperature=temperature))
    return rows


class BackendContract:
    """Subclass and implement `make_backend`; see the module docstring."""

    def make_backend(self, tmp_path: Path) -> tuple[Backend, TrainConfig]:
        """A fresh, not yet set-up backend and the config to set it up with."""
        raise NotImplementedError("implement make_backend(tmp_path) -> (backend, config)")

    @pytest.fixture
    def ready(self, tmp_path: Path) -> Iterator[tuple[Backend, TrainConfig]]:
        backend, config = self.make_backend(tmp_path)
        try:
            backend.setup(config)
            yield backend, config
        finally:
            backend.shutdown()

    @staticmethod
    def _step(backend: Backend, rows: list[TrainRow]) -> dict[str, float]:
        return asyncio.run(resolve_metrics(backend.train_step(rows)))

    def test_is_a_backend_with_capabilities(self, tmp_path: Path) -> None:
        backend, config = self.make_backend(tmp_path)
        assert isinstance(backend, Backend), f"{type(backend).__name__} lacks methods of rllm_train.backend.Backend"
        assert isinstance(backend.name, str) and backend.name
        caps = backend.capabilities()
        assert isinstance(caps, BackendCapabilities)
        assert caps.losses and caps.agg_modes, "a backend must support at least one loss and one aggregation"
        check_capabilities(config, caps, backend.name)  # its own test config must be one it accepts

    def test_refuses_what_it_cannot_train(self, tmp_path: Path) -> None:
        backend, config = self.make_backend(tmp_path)
        with pytest.raises(ConfigError, match="--loss"):
            check_capabilities(config.model_copy(update={"loss": "no-such-loss"}), backend.capabilities(),
                               backend.name)

    def test_endpoint_lifecycle_step_sync(self, ready: tuple[Backend, TrainConfig]) -> None:
        backend, config = ready
        endpoint = backend.policy_endpoint()
        assert endpoint.upstream_urls and all(u.rstrip("/").endswith("/v1") for u in endpoint.upstream_urls)
        backend.before_rollouts()
        rows = sample_rows(backend, max_tokens=config.max_tokens, temperature=config.temperature)
        backend.after_rollouts()
        assert rows and all(r.num_trained_tokens for r in rows)
        metrics = self._step(backend, rows)
        assert metrics, "train_step returned no metrics"
        bad = {k: v for k, v in metrics.items() if not (isinstance(v, int | float) and math.isfinite(v))}
        assert not bad, f"non-finite or non-numeric metrics: {bad}"
        version = backend.sync_weights()
        assert version > endpoint.policy_version, "sync_weights must return a newer policy version"
        assert backend.policy_endpoint().policy_version == version
        backend.before_rollouts()  # the engine samples again after a sync
        assert sample_rows(backend, n=1, max_tokens=config.max_tokens, temperature=config.temperature)
        backend.after_rollouts()

    def test_save_then_load_restores_version(self, ready: tuple[Backend, TrainConfig], tmp_path: Path) -> None:
        backend, config = ready
        self._step(backend, sample_rows(backend, max_tokens=config.max_tokens, temperature=config.temperature))
        saved_version = backend.sync_weights()
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        backend.save(ckpt)
        assert any(ckpt.iterdir()), "save wrote nothing"
        self._step(backend, sample_rows(backend, max_tokens=config.max_tokens, temperature=config.temperature))
        backend.sync_weights()
        backend.load(ckpt)
        assert backend.policy_endpoint().policy_version >= saved_version
        assert sample_rows(backend, n=1, max_tokens=config.max_tokens, temperature=config.temperature)

    def test_load_of_a_foreign_directory_fails_clearly(self, ready: tuple[Backend, TrainConfig],
                                                       tmp_path: Path) -> None:
        backend, _ = ready
        empty = tmp_path / "not-a-checkpoint"
        empty.mkdir()
        with pytest.raises(Exception) as info:  # any error type, but one whose message says what is wrong
            backend.load(empty)
        assert str(empty) in str(info.value) or "checkpoint" in str(info.value).lower()

    def test_shutdown_is_safe_twice(self, tmp_path: Path) -> None:
        backend, config = self.make_backend(tmp_path)
        backend.setup(config)
        backend.shutdown()
        backend.shutdown()
