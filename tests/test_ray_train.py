"""`rllm train --rollout-workers N`: a step's episodes run in Ray actors through the run's gateway, the loop
trains on them as on in-process ones, Ray counts land in metrics.jsonl, and Ray is stopped after the run; an
unreachable --ray-address is refused before the backend is set up."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray")

from rllm_core.errors import ConfigError  # noqa: E402
from rllm_core.net import free_port  # noqa: E402
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream  # noqa: E402
from rllm_testing.recording_backend import RecordingBackend  # noqa: E402
from rllm_testing.training import YesNoBenchmark, alternating_responder  # noqa: E402
from rllm_train.config import TrainConfig  # noqa: E402
from rllm_train.loop import train  # noqa: E402
from rllm_train.rundir import RunDir  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(alternating_responder()) as up:
        yield up
    if ray.is_initialized():
        ray.shutdown()


def _config(tmp_path: Path, **kw: object) -> TrainConfig:
    base: dict[str, object] = {"benchmark": "yesno", "batch_size": 4, "group_size": 2, "max_steps": 2,
                               "eval_examples": 0, "output": str(tmp_path / "run"), "max_tokens": 8,
                               "concurrency": 4, "rollout_workers": 2}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_train_with_rollout_workers_on_a_local_cluster(tmp_path: Path, upstream: FakeUpstream) -> None:
    backend = RecordingBackend(upstream.base_url)
    result = train(_config(tmp_path), backend=backend, benchmark=YesNoBenchmark(), progress=False)
    assert result.steps_done == 2 and not ray.is_initialized(), "the run's own cluster must be stopped"
    assert len(upstream.requests) == 2 * 4 * 2  # every episode of every step reached the upstream once
    for rows in backend.batches:
        assert len(rows) == 8 and len({r.trajectory_id for r in rows}) == 8
        assert all(len(r.sampling_logprobs) == len(r.tokens) and r.num_trained_tokens for r in rows)
        assert sorted({r.group_id for r in rows}).__len__() == 4  # 4 tasks × 2 attempts: 4 groups of 2
    records = [m for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"]
    assert [m["episode/count"] for m in records] == [8.0, 8.0]
    assert all(m["ray/lost"] == 0 and m["ray/worker_deaths"] == 0 for m in records)


def test_unreachable_ray_address_is_refused_before_setup(tmp_path: Path, upstream: FakeUpstream) -> None:
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    backend = RecordingBackend(upstream.base_url)
    with pytest.raises(ConfigError, match=address):
        train(_config(tmp_path, ray_address=address), backend=backend, benchmark=YesNoBenchmark(), progress=False)
    assert "setup" not in backend.events


def test_ray_address_needs_rollout_workers() -> None:
    with pytest.raises(ValueError, match="--ray-address auto is only used with --rollout-workers"):
        TrainConfig(ray_address="auto")


def test_verl_with_ray_rollout_workers_trains_and_shuts_down(tmp_path: Path) -> None:
    """The loop owns Ray (--rollout-workers), the backend's actor lives on it: shutdown order matters."""
    pytest.importorskip("verl")
    from typer.testing import CliRunner

    from rllm.cli.app import build_app

    assert not ray.is_initialized()
    out = tmp_path / "verl-ray"
    res = CliRunner().invoke(build_app(), ["train", "arithmetic", "--backend", "verl", "--model", "tiny-random",
                                           "--max-steps", "1", "--batch-size", "2", "--group-size", "2",
                                           "--eval-examples", "0", "--max-tokens", "6", "--rollout-workers", "2",
                                           "--no-progress", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "checkpoints" / "step_1" / "verl_actor").is_dir() and not ray.is_initialized()
