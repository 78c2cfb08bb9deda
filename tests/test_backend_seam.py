"""The backend seam v2 in the loop: capability refusals before setup, lifecycle hooks around rollouts, a
Future-returning train_step, several replicas behind the run's gateway (and a new set after a sync), v1
backends named missing methods, and the per-row behaviour/old logprobs and temperature."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rllm_core.errors import ConfigError, TrainingError
from rllm_core.types import Step, Trajectory
from rllm_rollout.gateway.config import UpstreamConfig
from rllm_rollout.gateway.router import Upstream, UpstreamRouter
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder
from rllm_train.backend import BackendCapabilities, PolicyEndpoint, check_capabilities
from rllm_train.config import TrainConfig
from rllm_train.loop import train
from rllm_train.packing import TrainRow, pack_trajectory
from rllm_train.rundir import RunDir


@pytest.fixture
def two_upstreams() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    with start_fake_upstream(alternating_responder()) as a, start_fake_upstream(alternating_responder()) as b:
        yield a, b


def _config(tmp_path: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"benchmark": "yesno", "batch_size": 4, "group_size": 2, "max_steps": 2,
                            "eval_examples": 0, "output": str(tmp_path / "run"), "max_tokens": 8, "concurrency": 8}
    base.update(kw)
    return TrainConfig(**base)


def test_check_capabilities_names_every_refused_option() -> None:
    caps = BackendCapabilities(losses=frozenset({"ppo"}), agg_modes=frozenset({"token-mean"}), kl_types=frozenset(),
                               lora=False, recompute_old_logprobs=False, devices=frozenset({"cuda"}),
                               notes={"agg": "its scale differs"})
    config = TrainConfig(loss="gspo", agg="seq-mean-token-sum-norm", kl_coef=0.1, lora_rank=8,
                         recompute_old_logprobs=True, device="cpu")
    with pytest.raises(ConfigError) as info:
        check_capabilities(config, caps, "toy")
    msg = str(info.value)
    for flag in ("--loss gspo", "--agg seq-mean-token-sum-norm", "its scale differs", "--kl-type k3",
                 "--lora-rank 8", "--recompute-old-logprobs on", "--device cpu", "'toy' backend"):
        assert flag in msg, (flag, msg)
    check_capabilities(TrainConfig(device="cuda:1"), caps, "toy")  # cuda:N is device type cuda


def test_loop_refuses_an_unsupported_loss_before_setup(tmp_path: Path, two_upstreams: Any) -> None:
    backend = RecordingBackend(two_upstreams[0].base_url, caps=BackendCapabilities(losses=frozenset({"ppo"})))
    with pytest.raises(ConfigError, match="--loss gspo"):
        train(_config(tmp_path, loss="gspo"), backend=backend, benchmark=YesNoBenchmark(), progress=False)
    assert "setup" not in backend.events and not (tmp_path / "run").exists()  # refused before anything ran


def test_lifecycle_order_and_future_train_step(tmp_path: Path, two_upstreams: Any) -> None:
    a, b = two_upstreams
    backend = RecordingBackend(a.base_url, asynchronous=True, replicas=[a.base_url, b.base_url])
    result = train(_config(tmp_path), backend=backend, benchmark=YesNoBenchmark(), progress=False)
    assert result.steps_done == 2 and backend.steps_done == 2
    per_step = ["before_rollouts", "after_rollouts", "train_step", "train_done", "sync_weights"]
    assert backend.events == ["setup", *per_step, *per_step]
    assert a.requests and b.requests, "sessions must spread over both replicas"
    assert len(a.requests) + len(b.requests) == 2 * 4 * 2  # steps × tasks × attempts, one call each
    metrics = [m for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"]
    assert [m["policy_version"] for m in metrics] == [1, 2]
    assert all(m["train/trained_tokens"] > 0 for m in metrics)


def test_a_failing_future_stops_the_run_with_its_step(tmp_path: Path, two_upstreams: Any) -> None:
    backend = RecordingBackend(two_upstreams[0].base_url, asynchronous=True, fail_at_step=2)
    with pytest.raises(TrainingError, match="training stopped at step 2: loss is NaN"):
        train(_config(tmp_path, max_steps=3), backend=backend, benchmark=YesNoBenchmark(), progress=False)


class _MovingReplicas(RecordingBackend):
    """Serves from `first` until the first sync, then from `second` (as verl's replicas may move)."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(first)
        self.first, self.second = first, second

    def policy_endpoint(self) -> PolicyEndpoint:
        url = self.first if self.version == 0 else self.second
        return PolicyEndpoint(url, self.model, self.version, replicas=(url,))


def test_gateway_takes_the_new_replicas_after_a_sync(tmp_path: Path, two_upstreams: Any) -> None:
    a, b = two_upstreams
    train(_config(tmp_path), backend=_MovingReplicas(a.base_url, b.base_url), benchmark=YesNoBenchmark(),
          progress=False)
    assert len(a.requests) == 8 and len(b.requests) == 8  # step 1 on a, step 2 on b


def test_router_replace_keeps_surviving_workers_and_drops_gone_sessions() -> None:
    ua, ub, uc = (Upstream(UpstreamConfig(url=f"http://127.0.0.1:{p}/v1")) for p in (1, 2, 3))
    router = UpstreamRouter([ua, ub])
    assert router.pick("s1") is ua and router.pick("s2") is ub
    router.replace([Upstream(UpstreamConfig(url=ua.url)), uc])
    assert router.upstreams[0] is ua and ua.sessions == 1  # same URL: same worker, its sessions kept
    assert router.pick("s1") is ua
    assert router.pick("s2") is uc  # its worker is gone: re-assigned
    with pytest.raises(ValueError, match="at least one upstream"):
        router.replace([])


def test_create_backend_names_the_missing_v2_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm_train import backend

    class V1Backend:
        name = "v1"

        def setup(self, config: Any) -> None: ...
        def policy_endpoint(self) -> Any: ...
        def train_step(self, rows: Any) -> Any: ...
        def sync_weights(self) -> int: return 0
        def save(self, path: Any) -> None: ...
        def load(self, path: Any) -> None: ...
        def shutdown(self) -> None: ...

    monkeypatch.setattr(backend, "get_backends", lambda: {"v1": backend.BackendSpec("v1", lambda c: V1Backend())})
    with pytest.raises(ConfigError, match=r"capabilities, before_rollouts, after_rollouts.*BackendBase"):
        backend.create_backend("v1", TrainConfig())


def test_resolve_metrics_accepts_dicts_futures_and_awaitables() -> None:
    import asyncio

    from rllm_train.backend import resolve_metrics

    fut: concurrent.futures.Future = concurrent.futures.Future()
    fut.set_result({"loss": 1.0})

    async def coro() -> dict[str, float]:
        return {"loss": 2.0}

    async def go() -> list[dict[str, float]]:
        return [await resolve_metrics({"loss": 0.0}), await resolve_metrics(fut), await resolve_metrics(coro())]

    assert asyncio.run(go()) == [{"loss": 0.0}, {"loss": 1.0}, {"loss": 2.0}]
    with pytest.raises(TrainingError, match="not a dict"):
        asyncio.run(resolve_metrics(3.0))  # type: ignore[arg-type]


def test_rows_keep_behaviour_and_old_logprobs_and_their_temperature() -> None:
    row = TrainRow(tokens=[1, 2, 3], loss_mask=[0, 1, 1], sampling_logprobs=[0.0, -0.5, -0.7],
                   advantages=[0.0, 1.0, 1.0], old_logprobs=[0.0, -0.4, -0.6], temperature=0.7)
    assert row.behaviour_logprobs == [0.0, -0.5, -0.7] and row.old_logprobs == [0.0, -0.4, -0.6]
    with pytest.raises(ValueError, match="old_logprobs has 2 entries for 3 tokens"):
        TrainRow(tokens=[1, 2, 3], loss_mask=[0, 1, 1], sampling_logprobs=[0.0, -0.5, -0.7],
                 advantages=[0.0, 1.0, 1.0], old_logprobs=[0.0, -0.4])


def _step(prompt: list[int], completion: list[int], temperature: float | None) -> Step:
    params = {} if temperature is None else {"temperature": temperature}
    return Step(prompt_token_ids=prompt, completion_token_ids=completion, logprobs=[-0.1] * len(completion),
                token_source="server", params=params)


def test_packing_records_temperature_and_splits_where_it_changes() -> None:
    same = Trajectory(steps=[_step([1, 2], [3], 0.7), _step([1, 2, 3, 4], [5], 0.7)])
    rows, _ = pack_trajectory(same, 1.0)
    assert len(rows) == 1 and rows[0].temperature == 0.7
    mixed = Trajectory(steps=[_step([1, 2], [3], 0.7), _step([1, 2, 3, 4], [5], 1.0)])
    rows, metrics = pack_trajectory(mixed, 1.0)
    assert [r.temperature for r in rows] == [0.7, 1.0] and metrics["rows_split"] == 1
    rows, _ = pack_trajectory(Trajectory(steps=[_step([1], [2], None)]), 1.0)
    assert rows[0].temperature is None


def test_a_cluster_asked_of_a_one_device_backend_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"--n-gpus 8 \(supported: 1: it trains on one device\); --nnodes 2"):
        check_capabilities(TrainConfig(n_gpus=8, nnodes=2), BackendCapabilities(), "local")
    check_capabilities(TrainConfig(n_gpus=8, nnodes=2), BackendCapabilities(multi_gpu=True), "verl")
