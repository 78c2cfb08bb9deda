"""rllm across hosts (issue 34): a Ray head, two worker nodes, the gateway and the policy server each on a host of
its own (network namespaces, rllm_testing/netns_cluster.py). `rllm eval` runs its episodes on the worker hosts
and records them through the gateway host, whose own count equals the run's; a host without the tokens can read
nothing and push nothing. The faults are measured by benchmarks/cluster_faults.py."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from rllm_testing.cluster_services import HOSTS, ClusterServices
from rllm_testing.netns_cluster import NetnsCluster, NetnsUnavailable

pytestmark = pytest.mark.slow

_STATUS = """
import json, sys, urllib.request, urllib.error
method, url, token = sys.argv[1], sys.argv[2], sys.argv[3]
body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}' if method != "GET" else None
headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + token} if token else {})}
try:
    print(urllib.request.urlopen(urllib.request.Request(url, data=body, method=method, headers=headers),
                                 timeout=30).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServices]:
    workdir = tmp_path_factory.mktemp("cluster")
    try:
        cluster = NetnsCluster(list(HOSTS), log_dir=workdir / "logs").up()
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    svc = ClusterServices(cluster, workdir)
    try:
        svc.start_policy()
        svc.start_gateway()
        svc.start_ray(["worker1", "worker2"])
        yield svc
    finally:
        cluster.close()
        svc.close()


def _status(svc: ClusterServices, host: str, method: str, url: str, token: str = "") -> int:
    proc = svc.cluster.run(host, [sys.executable, "-c", _STATUS, method, url, token], timeout=60, env=svc.env)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


def test_eval_runs_on_the_worker_hosts_through_the_gateway_host(services: ClusterServices) -> None:
    out = services.workdir / "eval"
    proc = services.rllm("head", ["eval", "arithmetic", "-n", "16", "--attempts", "2", "--max-tokens", "8",
                                  "--gateway", services.gateway_url, "--rollout-workers", "2", "--ray-address",
                                  services.ray_address, "-o", str(out), "--no-progress"], timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    steps = [s for e in episodes for t in e["trajectories"] for s in t["steps"]]
    assert len(episodes) == 32 and not [e for e in episodes if e.get("error")]
    assert all(s["completion_token_ids"] and s["prompt_token_ids"] for s in steps)  # ids from the policy host
    ray = json.loads((out / "summary.json").read_text())["config"]["ray"]
    assert ray["address"] == services.ray_address and ray["lost"] == 0
    assert sum(ray["by_worker"].values()) == 32 and len(ray["by_worker"]) == 2
    workers = {services.cluster.address("worker1"), services.cluster.address("worker2")}
    assert set(ray["by_node"]) == workers  # both worker hosts ran episodes, the head none
    stats = services.gateway_stats()
    assert stats["recorded_steps"] == len(steps) and stats["stored_steps"] == 0 and stats["late_steps"] == 0
    assert stats["upstreams"] == [f"{services.policy_url}/v1"]


def test_a_host_without_the_tokens_reads_nothing_and_pushes_nothing(services: ClusterServices) -> None:
    gw, policy = services.gateway_url, services.policy_url
    for host in ("worker1", "head"):  # a worker host holds no token; the head uses its own only where given
        assert _status(services, host, "GET", f"{gw}/stats") == 401
        assert _status(services, host, "POST", f"{gw}/v1/chat/completions") == 401  # cannot spend the upstream
        assert _status(services, host, "GET", f"{gw}/sessions/someone/steps") == 401  # cannot read a session
        assert _status(services, host, "POST", f"{gw}/sessions/forged-id/v1/chat/completions") in (401, 403)
        assert _status(services, host, "PUT", f"{policy}/admin/weights") == 401  # cannot replace the weights
    assert _status(services, "head", "GET", f"{gw}/stats", services.gateway_token) == 200


def test_nothing_crosses_loopback_between_hosts(services: ClusterServices) -> None:
    probe = ("import socket, sys\ns = socket.socket(); s.settimeout(3)\n"
             "print(s.connect_ex(('127.0.0.1', int(sys.argv[1]))))")
    for host, port in (("head", 8080), ("head", 8000), ("worker1", 8000)):
        code = services.cluster.run(host, [sys.executable, "-c", probe, str(port)], timeout=30).stdout.strip()
        assert code != "0", f"{host} reached port {port} on its loopback: a service is not on its own host"
    assert "default" not in services.cluster.run("head", ["ip", "route"]).stdout


def test_train_runs_across_the_hosts_and_the_policy_host_serves_each_steps_weights(services: ClusterServices) -> None:
    run, cfg = services.workdir / "train", services.workdir / "train.yaml"
    cfg.write_text(json.dumps({"backend_options": {"policy_server": services.policy_url}}))
    before = services.gateway_stats()["recorded_steps"]
    proc = services.rllm("head", ["train", "arithmetic", "--model", "tiny-random", "--config", str(cfg), "--output",
                                  str(run), "--max-steps", "2", "--batch-size", "4", "--group-size", "2",
                                  "--max-tokens", "8", "--rollout-workers", "2", "--ray-address",
                                  services.ray_address, "--gateway", services.gateway_url, "--eval-examples", "0",
                                  "--no-progress"], timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    episodes = [json.loads(line) for f in sorted((run / "episodes").glob("step_*.jsonl"))
                for line in f.read_text().splitlines()]
    calls = sum(len(t["steps"]) for e in episodes for t in e["trajectories"])
    assert len(episodes) == 16 and services.gateway_stats()["recorded_steps"] - before == calls
    versions = {s["policy_version"] for e in episodes for t in e["trajectories"] for s in t["steps"]}
    assert versions == {0, 1}  # step 2 sampled the weights the trainer pushed after step 1
    health = services.cluster.run("head", [sys.executable, "-c", "import urllib.request,sys;print(urllib.request."
                                           "urlopen(sys.argv[1]).read().decode())", f"{services.policy_url}/health"],
                                  timeout=30).stdout
    assert json.loads(health)["policy_version"] == 2  # and the weights of step 2, pushed at its end
