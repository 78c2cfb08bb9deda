"""A policy server on another host (rllm_serve/weights_route.py, rllm_backends/local_torch/remote_server.py): the
trainer pushes its weights over HTTP behind the server's admin token, the server then samples exactly the
trainer's numbers, and a restarted server gets the trainer's weights back before the next rollouts."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save
from test_backend_local import _cfg, _max_logprob_gap, _sample

from rllm_backends.local_torch.backend import LocalTorchBackend
from rllm_core.errors import ConfigError
from rllm_serve import start_policy_server


def test_the_weights_route_needs_the_admin_token_and_the_served_models_names() -> None:
    with start_policy_server("tiny-random", max_batch_size=4, admin_token="adm-token") as server:
        url = f"{server.url}/admin/weights"
        name, tensor = next(iter(server.loaded.model.state_dict().items()))
        good = save({name: torch.zeros_like(tensor).contiguous()})
        assert httpx.put(url, content=good).status_code == 401
        assert httpx.put(url, content=good, headers={"Authorization": "Bearer wrong"}).status_code == 401
        auth = {"Authorization": "Bearer adm-token"}
        bad = httpx.put(url, content=b"not safetensors", headers=auth)
        assert bad.status_code == 400 and "safetensors" in bad.json()["error"]["message"]
        other = httpx.put(url, content=save({"not.a.param": torch.zeros(2)}), headers=auth)
        assert other.status_code == 400 and "not parameters" in other.json()["error"]["message"]
        big = httpx.put(url, content=save({"not.a.param": torch.zeros(20_000_000)}), headers=auth, timeout=60)
        assert big.status_code == 400  # 80 MB is read (not 413: the chat routes' body limit is not this route's)
        ok = httpx.put(url, content=good, headers={**auth, "X-Policy-Version": "7"})
        assert ok.status_code == 200 and ok.json()["policy_version"] == 7 == server.policy_version
    with start_policy_server("tiny-random", max_batch_size=4) as server:  # no token: no route at all
        assert httpx.put(f"{server.url}/admin/weights", content=good).status_code == 404


@pytest.mark.slow
def test_a_trainer_on_another_host_drives_the_server_and_rides_out_its_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_SERVE_ADMIN_TOKEN", "adm-token")
    server: Any = start_policy_server("tiny-random", max_batch_size=8, admin_token="adm-token")
    backend = LocalTorchBackend()
    try:
        backend.setup(_cfg(backend_options={"policy_server": server.url}))
        assert backend.policy_endpoint().base_url == server.base_url
        assert backend.policy_endpoint().inject_token_ids  # our server, though not on loopback in a cluster
        rows, version = _sample(backend)
        assert version == 0 and _max_logprob_gap(backend, rows) < 1e-4  # the trainer's start weights, pushed
        backend.train_step(rows)
        assert backend.sync_weights() == 1
        rows2, version2 = _sample(backend)
        assert version2 == 1 and _max_logprob_gap(backend, rows2) < 1e-4 < _max_logprob_gap(backend, rows)
        port = int(server.url.rsplit(":", 1)[1])
        server.stop()  # the host restarts: a fresh server on the same address serves base weights, version 0
        server = start_policy_server("tiny-random", max_batch_size=8, port=port, admin_token="adm-token")
        assert server.policy_version == 0
        backend.before_rollouts()  # the trainer notices and pushes its own weights back, under its version
        rows3, version3 = _sample(backend)
        assert version3 == 1 and _max_logprob_gap(backend, rows3) < 1e-4
    finally:
        backend.shutdown()
        server.stop()


def test_a_remote_policy_server_needs_its_token_and_no_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLLM_SERVE_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="RLLM_SERVE_ADMIN_TOKEN"):
        LocalTorchBackend().setup(_cfg(backend_options={"policy_server": "http://198.18.0.5:8000"}))
    monkeypatch.setenv("RLLM_SERVE_ADMIN_TOKEN", "x")
    with pytest.raises(ConfigError, match="--roles"):
        LocalTorchBackend().setup(_cfg(backend_options={"policy_server": "http://198.18.0.5:8000"},
                                       roles="solver=lora:solver", lora_rank=4))
