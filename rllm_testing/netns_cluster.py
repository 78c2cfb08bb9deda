"""A cluster of hosts on one Linux machine: network namespaces joined by a bridge, each with its own address.

    with NetnsCluster(["head", "worker1", "worker2", "gateway", "policy"]) as cluster:
        cluster.address("policy")                          # '198.18.0.5'
        cluster.spawn("policy", ["rllm", "serve", ...])    # a process on that host (its own network stack)
        cluster.partition("worker1"); cluster.heal("worker1")
        cluster.kill_host("worker1")                       # every process on the host, at once

Every host is a namespace `<prefix>-<host>` with a loopback of its own and one interface, `eth0`, a veth whose
other end is a port of the bridge `br0` in one more namespace, `<prefix>-sw` (the switch), so the machine's own
network is never touched. Addresses come from 198.18.0.0/15 (RFC 2544: set aside for benchmarking networks, used
by no real one), one /24 per cluster, and no host has a default route: nothing leaves the cluster, and 127.0.0.1
inside a host is that host's alone. A partition stops the host's switch port from forwarding (every frame to and
from it dropped in silence, links up; `tc netem` needs a kernel module not every machine has, and this machine has
no iptables); healing lets it forward again.

Processes share the machine's files (the venv, the run directory), as hosts with a shared disk would. Building
needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); `NetnsUnavailable` names the call a kernel refused, so a test can skip
with that reason. `close()` (and leaving the `with`) kills every process in the namespaces and deletes them,
whatever happened before.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["NetnsCluster", "NetnsUnavailable", "netns_unavailable_reason"]

SUBNET = "198.18"
"""The benchmarking range's first /16 (198.18.0.0/15 spans 198.18 and 198.19)."""


class NetnsUnavailable(RuntimeError):
    """The machine would not build the cluster; the message names the command that failed and why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise NetnsUnavailable(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.returncode}")


def netns_unavailable_reason() -> str | None:
    """Why a cluster cannot be built here (not root, no `ip`), or None when it can be tried."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    return None


class NetnsCluster:
    """Hosts in network namespaces on one bridge (module docstring). `subnet_index` picks the /24
    (198.18.<index>.0/24; default from the pid, so parallel test workers do not collide)."""

    def __init__(self, hosts: Sequence[str], prefix: str | None = None, subnet_index: int | None = None,
                 log_dir: str | os.PathLike[str] | None = None) -> None:
        if len(set(hosts)) != len(hosts) or not hosts:
            raise ValueError(f"hosts must be distinct names, got {list(hosts)}")
        if len(hosts) > 250:
            raise ValueError("at most 250 hosts fit one /24")
        self.hosts = list(hosts)
        self.prefix = prefix or f"rllm{os.getpid() % 100000}"
        self.subnet_index = subnet_index if subnet_index is not None else os.getpid() % 250
        self.log_dir = Path(log_dir) if log_dir else None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        self._logs: list[IO[bytes]] = []

    # ---------------------------------------------------------------------------------------------- layout
    def namespace(self, host: str) -> str:
        if host not in self.hosts:
            raise KeyError(f"no host {host!r} in this cluster ({', '.join(self.hosts)})")
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.subnet_index}.{self.hosts.index(host) + 1}"

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def layout(self) -> list[dict[str, str]]:
        """One row per host: name, namespace, address (for notes and logs)."""
        return [{"host": h, "namespace": self.namespace(h), "address": self.address(h)} for h in self.hosts]

    def _port(self, host: str) -> str:
        return f"p{self.hosts.index(host)}-{self.prefix}"[:15]  # interface names: at most 15 bytes

    # ---------------------------------------------------------------------------------------------- build
    def __enter__(self) -> NetnsCluster:
        self.up()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def up(self) -> NetnsCluster:
        """Build the switch and the hosts; on any failure, what was built is torn down and NetnsUnavailable says
        which call failed."""
        reason = netns_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        try:
            self._add_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts:
                ns = self.namespace(host)
                self._add_namespace(ns)
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", self._port(host),
                    "netns", self.switch)
                _ip("-n", self.switch, "link", "set", self._port(host), "master", "br0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "del", ns, check=False)  # a namespace left by a killed earlier run of the same pid
        _ip("netns", "add", ns)
        self._made.append(ns)

    # ---------------------------------------------------------------------------------------------- processes
    def spawn(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log_name: str | None = None, cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
        """Start `argv` on `host` (`ip netns exec`), in a session of its own; output to
        `<log_dir>/<log_name or host>.log` when the cluster has a log folder, else discarded."""
        out: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{log_name or host}.log", "ab")  # noqa: SIM115 - closed in close()
            self._logs.append(out)
        proc = subprocess.Popen(["ip", "netns", "exec", self.namespace(host), *argv], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(env) if env is not None else None, cwd=cwd)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], timeout: float = 60.0,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` on `host` to the end (bounded by `timeout`); its output captured."""
        return subprocess.run(["ip", "netns", "exec", self.namespace(host), *argv], capture_output=True, text=True,
                              timeout=timeout, env=dict(env) if env is not None else None)

    def pids(self, host: str) -> list[int]:
        """Every process on `host` now (those started by Ray or by a daemon too, not only `spawn`'s)."""
        out = _ip("netns", "pids", self.namespace(host), check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill_host(self, host: str, sig: int = signal.SIGKILL) -> int:
        """Kill every process on `host` (a machine losing power): how many were signalled."""
        killed = 0
        for _ in range(5):  # a dying supervisor may start a child meanwhile: sweep until none is left
            pids = self.pids(host)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        return killed

    # ---------------------------------------------------------------------------------------------- faults
    def partition(self, host: str) -> None:
        """Cut `host` off from every other host: its switch port stops forwarding (bridge port state disabled),
        so every frame to or from it is dropped in silence while its link stays up, as behind a failed switch;
        its processes go on running and their connections hang rather than fail. (Without the `bridge` tool:
        the port's link goes down, which the host sees at once.)"""
        if shutil.which("bridge"):
            _run(["bridge", "-n", self.switch, "link", "set", "dev", self._port(host), "state", "0"])
        else:
            _ip("-n", self.switch, "link", "set", self._port(host), "down")

    def heal(self, host: str) -> None:
        if shutil.which("bridge"):
            _run(["bridge", "-n", self.switch, "link", "set", "dev", self._port(host), "state", "3"])  # forwarding
        else:
            _ip("-n", self.switch, "link", "set", self._port(host), "up")

    # ---------------------------------------------------------------------------------------------- teardown
    def close(self) -> None:
        """Kill every process on every host, delete the namespaces; safe to call twice, never raises."""
        for ns in reversed(self._made):
            host = ns[len(self.prefix) + 1:]
            if host in self.hosts:
                self.kill_host(host)
        for proc in self._procs:
            try:
                proc.kill()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        for f in self._logs:
            f.close()
        self._logs.clear()
