"""rllm's services on the hosts of a `NetnsCluster`: a Ray head and worker nodes, the policy server, the gateway.

    with NetnsCluster(HOSTS, log_dir=run / "logs") as cluster:
        services = ClusterServices(cluster, workdir=run)
        services.start_policy()          # rllm serve on `policy`, weights pushed to it behind an admin token
        services.start_gateway()         # rllm gateway on `gateway`, SQLite store, the policy server upstream
        services.start_ray(["worker1", "worker2"])
        services.rllm("head", ["eval", "arithmetic", *services.eval_flags(workers=2)])

Each service is a plain rllm (or ray) command run on its host, exactly as a user would start it on a machine of
its own; the tokens travel in the environment, never on a command line another user could read in `ps`.
`restart_*` kill a host's processes and start the service again (the faults of benchmarks/cluster_faults.py).
Every wait is bounded (`timeout_s`) and says what it waited for.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rllm_testing.netns_cluster import NetnsCluster

__all__ = ["HOSTS", "ClusterServices"]

HOSTS = ("head", "worker1", "worker2", "gateway", "policy")
"""The layout of issue 34: the trainer/driver and Ray head, two Ray worker nodes, the gateway, the policy server."""

POLICY_PORT, GATEWAY_PORT, RAY_PORT = 8000, 8080, 6379

_PROBE = """
import sys, time, urllib.request
url, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        sys.exit(0)
    except Exception as exc:
        if time.monotonic() > deadline:
            sys.exit(f"{url}: {exc}")
        time.sleep(0.3)
"""


class ClusterServices:
    """Starts and restarts rllm's services on a cluster's hosts (module docstring)."""

    def __init__(self, cluster: NetnsCluster, workdir: Path, model: str = "tiny-random",
                 env: Mapping[str, str] | None = None) -> None:
        self.cluster = cluster
        self.workdir = Path(workdir)
        self.model = model
        self.admin_token = secrets.token_urlsafe(16)
        self.gateway_token = secrets.token_urlsafe(16)
        base = {k: v for k, v in os.environ.items() if k not in ("RLLM_SERVE_ADMIN_TOKEN", "RLLM_GATEWAY_API_KEY")}
        self.env = {**base, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        """What every host has; a token only where it is used (`env_for`): a worker host holds none."""
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="rr", dir="/tmp"))
        """Ray's folders, one per node: short, as Ray's unix socket paths must be (at most 107 bytes)."""

    def close(self) -> None:
        """Remove Ray's folders (the cluster's close() has killed the processes)."""
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def env_for(self, host: str) -> dict[str, str]:
        """The environment of `host`'s processes: the policy server's admin token on its host and on the trainer's
        (which pushes weights), the gateway's token on its host and the driver's; none on a worker host."""
        tokens = {"policy": {"RLLM_SERVE_ADMIN_TOKEN": self.admin_token},
                  "gateway": {"RLLM_GATEWAY_API_KEY": self.gateway_token},
                  "head": {"RLLM_SERVE_ADMIN_TOKEN": self.admin_token, "RLLM_GATEWAY_API_KEY": self.gateway_token}}
        return {**self.env, **tokens.get(host, {})}

    # ---------------------------------------------------------------------------------------------- addresses
    @property
    def policy_url(self) -> str:
        return f"http://{self.cluster.address('policy')}:{POLICY_PORT}"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.cluster.address('gateway')}:{GATEWAY_PORT}"

    @property
    def ray_address(self) -> str:
        return f"{self.cluster.address('head')}:{RAY_PORT}"

    @property
    def gateway_db(self) -> Path:
        return self.workdir / "gateway.db"

    # ---------------------------------------------------------------------------------------------- services
    def rllm_argv(self, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", "rllm", *args]

    def wait_http(self, url: str, from_host: str = "head", timeout_s: float = 120.0) -> None:
        """Until `url` answers from `from_host` (a bounded probe run on that host)."""
        proc = self.cluster.run(from_host, [sys.executable, "-c", _PROBE, url, str(timeout_s)],
                                timeout=timeout_s + 30, env=self.env)
        if proc.returncode:
            raise TimeoutError(f"not up after {timeout_s:g} s: {proc.stderr.strip()[-300:]}")

    def start_policy(self, timeout_s: float = 300.0) -> None:
        argv = self.rllm_argv(["serve", "--model", self.model, "--host", self.cluster.address("policy"), "--port",
                               str(POLICY_PORT), "--dtype", "float32", "--max-batch-size", "32"])
        self.procs["policy"] = self.cluster.spawn("policy", argv, env=self.env_for("policy"), log_name="policy")
        self.wait_http(f"{self.policy_url}/health", timeout_s=timeout_s)

    def start_gateway(self, timeout_s: float = 120.0) -> None:
        argv = self.rllm_argv(["gateway", "--upstream", f"{self.policy_url}/v1", "--inject", "--host",
                               self.cluster.address("gateway"), "--port", str(GATEWAY_PORT), "--store",
                               f"sqlite:{self.gateway_db}"])
        self.procs["gateway"] = self.cluster.spawn("gateway", argv, env=self.env_for("gateway"),
                                                   log_name="gateway")
        self.wait_http(f"{self.gateway_url}/health", timeout_s=timeout_s)

    def start_ray(self, workers: Sequence[str] = ("worker1", "worker2"), cpus_per_worker: int = 1,
                  timeout_s: float = 120.0) -> None:
        """The head (no CPUs for actors: episodes run on the worker hosts), then each worker node."""
        ray = str(Path(sys.executable).with_name("ray"))
        head = self.cluster.address("head")
        self.procs["ray-head"] = self.cluster.spawn(
            "head", [ray, "start", "--head", "--block", f"--node-ip-address={head}", f"--port={RAY_PORT}",
                     "--num-cpus=0", "--include-dashboard=false", "--disable-usage-stats",
                     f"--temp-dir={self.ray_tmp / 'head'}"], env=self.env, log_name="ray-head")
        self._wait_ray_nodes(1, timeout_s)
        for n, host in enumerate(workers, 2):
            self.start_ray_worker(host, cpus_per_worker)
            self._wait_ray_nodes(n, timeout_s)

    def start_ray_worker(self, host: str, cpus: int = 1) -> None:
        """A Ray node on `host`, its processes pinned to `cpus` cores of their own where the machine has them
        (worker N on cores from (N-1)·cpus): hosts on one machine would otherwise all share every core, and a
        second worker host would add no compute."""
        ray = str(Path(sys.executable).with_name("ray"))
        first = self.cluster.hosts.index("worker1") if "worker1" in self.cluster.hosts else 0
        index, cores = max(0, self.cluster.hosts.index(host) - first), os.cpu_count() or 1
        pin: list[str] = []
        if shutil.which("taskset") and cores > 1:
            pin = ["taskset", "-c", ",".join(str((index * cpus + i) % cores) for i in range(cpus))]
        self.procs[f"ray-{host}"] = self.cluster.spawn(
            host, [*pin, ray, "start", "--block", f"--address={self.ray_address}",
                   f"--node-ip-address={self.cluster.address(host)}", f"--num-cpus={cpus}", "--disable-usage-stats",
                   f"--temp-dir={self.ray_tmp / host}"], env=self.env, log_name=f"ray-{host}")

    def _wait_ray_nodes(self, n: int, timeout_s: float) -> None:
        code = ("import ray, sys, time\nray.init(address=sys.argv[1], logging_level='ERROR')\n"
                "deadline = time.monotonic() + float(sys.argv[3])\n"
                "while sum(x['Alive'] for x in ray.nodes()) < int(sys.argv[2]):\n"
                "    if time.monotonic() > deadline: sys.exit('ray nodes: %d alive' % sum(x['Alive'] for x in "
                "ray.nodes()))\n    time.sleep(0.5)\n")
        deadline = time.monotonic() + timeout_s
        while True:
            proc = self.cluster.run("head", [sys.executable, "-c", code, self.ray_address, str(n), str(timeout_s)],
                                    timeout=timeout_s + 60, env=self.env)
            if proc.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray: {n} nodes not alive after {timeout_s:g} s: {proc.stderr.strip()[-300:]}")
            time.sleep(1.0)

    # ---------------------------------------------------------------------------------------------- restarts
    def restart(self, host: str) -> float:
        """Kill everything on `host` and start its service again; seconds it was down."""
        started = time.monotonic()
        self.cluster.kill_host(host)
        if host == "gateway":
            self.start_gateway()
        elif host == "policy":
            self.start_policy()
        elif host.startswith("worker"):
            self.start_ray_worker(host)
        else:
            raise ValueError(f"no service to restart on {host!r}")
        return time.monotonic() - started

    # ---------------------------------------------------------------------------------------------- runs
    def spawn_rllm(self, host: str, args: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        return self.cluster.spawn(host, self.rllm_argv(args), env=self.env_for(host), log_name=log_name,
                                  cwd=self.workdir)

    def rllm(self, host: str, args: Sequence[str], timeout_s: float = 900.0) -> subprocess.CompletedProcess[str]:
        return self.cluster.run(host, self.rllm_argv(args), timeout=timeout_s, env=self.env_for(host))

    def gateway_stats(self) -> dict[str, Any]:
        """The gateway's /stats, read from the head host with the gateway's token."""
        code = ("import json, sys, urllib.request\n"
                "req = urllib.request.Request(sys.argv[1] + '/stats', headers={'Authorization': 'Bearer ' + "
                "sys.argv[2]})\nprint(urllib.request.urlopen(req, timeout=10).read().decode())\n")
        proc = self.cluster.run("head", [sys.executable, "-c", code, self.gateway_url, self.gateway_token],
                                timeout=60, env=self.env)
        if proc.returncode:
            raise RuntimeError(f"gateway /stats: {proc.stderr.strip()[-300:]}")
        return dict(json.loads(proc.stdout))
