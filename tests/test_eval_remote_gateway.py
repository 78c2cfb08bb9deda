"""`rllm eval --gateway URL`: episodes recorded through an `rllm gateway` running elsewhere (its own host in a
cluster), and the gateway's own count of what it recorded equals the run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllm_core.errors import ConfigError
from rllm_envs.eval.runner import EvalOptions, run_eval
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_serve import start_policy_server


def test_eval_records_through_a_gateway_started_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with start_policy_server("tiny-random", max_batch_size=8) as server:
        upstream = UpstreamConfig(url=server.base_url, inject_token_ids=True)
        gateway = start_gateway([upstream], api_key="gw-token", store=f"sqlite:{tmp_path / 'gw.db'}")
        try:
            monkeypatch.setenv("RLLM_GATEWAY_API_KEY", "gw-token")
            result = run_eval(EvalOptions(benchmark="arithmetic", max_examples=6, attempts=2, max_tokens=8,
                                          gateway=gateway.url, output=tmp_path / "run", progress=False))
            stats = json.loads(json.dumps(gateway.stats()))
        finally:
            gateway.stop()
    episodes = [json.loads(line) for line in result.episodes_path.read_text().splitlines()]
    steps = sum(len(t["steps"]) for e in episodes for t in e["trajectories"])
    assert len(episodes) == 12 and steps >= 12
    assert all(s["completion_token_ids"] for e in episodes for t in e["trajectories"] for s in t["steps"])
    assert stats["recorded_steps"] == steps and stats["closed_sessions"] == 12  # each episode took its session
    assert stats["late_steps"] == 0 and stats["stored_steps"] == 0  # nothing left behind, nothing dropped


def test_eval_gateway_refuses_a_second_model_address(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="drop --base-url"):
        run_eval(EvalOptions(benchmark="arithmetic", gateway="http://198.18.0.4:8080",
                             base_url="http://127.0.0.1:1/v1", output=tmp_path / "x"))


def test_eval_gateway_needs_its_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLLM_GATEWAY_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="set RLLM_GATEWAY_API_KEY"):
        run_eval(EvalOptions(benchmark="arithmetic", gateway="http://198.18.0.4:8080", output=tmp_path / "x"))
