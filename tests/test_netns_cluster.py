"""The simulated cluster (rllm_testing/netns_cluster.py): hosts with their own addresses and loopbacks, partitions
that drop traffic and heal, a host killed whole, and nothing left behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rllm_testing.netns_cluster import NetnsCluster, NetnsUnavailable

FETCH = ("import sys, urllib.request\n"
         "try:\n"
         "    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)\n"
         "except Exception as exc:\n"
         "    print(type(exc).__name__, getattr(exc, 'reason', ''))\n")


def _cluster(hosts: list[str]) -> NetnsCluster:
    try:
        return NetnsCluster(hosts).up()
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")


def _fetch(cluster: NetnsCluster, host: str, url: str) -> str:
    return cluster.run(host, [sys.executable, "-c", FETCH, url], timeout=20).stdout.strip()


def test_hosts_reach_each_other_by_address_never_by_loopback_and_partitions_heal() -> None:
    cluster = _cluster(["a", "b"])
    try:
        assert cluster.address("a").startswith("198.18.") and cluster.address("b") != cluster.address("a")
        routes = cluster.run("a", ["ip", "route"]).stdout
        assert "default" not in routes  # no way out of the cluster
        b = cluster.address("b")
        cluster.spawn("b", [sys.executable, "-m", "http.server", "8000", "--bind", b])
        url = f"http://{b}:8000/"
        for _ in range(50):
            if _fetch(cluster, "a", url) == "200":
                break
        assert _fetch(cluster, "a", url) == "200"
        assert "refused" in _fetch(cluster, "a", "http://127.0.0.1:8000/")  # a's loopback is a's own
        cluster.partition("b")
        assert "timed out" in _fetch(cluster, "a", url)
        cluster.heal("b")
        assert _fetch(cluster, "a", url) == "200"
        assert cluster.kill_host("b") >= 1 and cluster.pids("b") == []
        assert "refused" in _fetch(cluster, "a", url) or "timed out" in _fetch(cluster, "a", url)
    finally:
        cluster.close()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert cluster.prefix not in names  # torn down
    cluster.close()  # twice: harmless
