"""Connecting to Ray: a local cluster for one run, or an existing cluster, checked before any work starts.

Ray's own `ray.init(address=...)` can wait a long time on an address where nothing answers, so the address
is resolved and probed with a short TCP connect first: a typo in `--ray-address` fails in seconds with a
`ConfigError` naming it, not after the endpoint was opened and the benchmark loaded. Ray is imported only
here, inside functions, so that `import rllm_core...` never pulls it in.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rllm_core.errors import ConfigError

__all__ = ["RayConnection", "check_ray_address", "connect_ray", "import_ray"]

log = logging.getLogger("rllm.distributed")

PROBE_TIMEOUT_S = 3.0
"""How long the TCP probe of a cluster address may take: a live head node answers in milliseconds."""
LOCAL_HOST = "127.0.0.1"
"""A local cluster binds to the loopback interface only: it exists for one run on this machine."""


@dataclass(frozen=True)
class RayConnection:
    """Where `connect_ray` connected: what a caller needs to place servers the workers must reach."""

    address: str
    """'local' for a cluster started here, else the cluster's host:port (or ray:// URL) as connected."""
    local: bool
    """True when connect_ray started the cluster (and stops it on exit)."""
    owned: bool
    """False when Ray was already initialized by the caller: connect_ray then leaves it running on exit."""
    cpus: float
    """The cluster's CPUs when connected (fractional worker CPUs are sized from it)."""
    node_ip: str
    """This driver's node address as Ray sees it: where workers on other nodes reach the driver's gateway."""
    node_ips: tuple[str, ...] = ()
    """The addresses of the cluster's live nodes."""

    @property
    def single_node(self) -> bool:
        """True when every live node is this driver's own (so a gateway on 127.0.0.1 reaches them all)."""
        return self.local or all(ip in (self.node_ip, LOCAL_HOST) for ip in self.node_ips)


def import_ray() -> Any:
    """`import ray`, or a ConfigError that names the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f'Ray is not installed ({exc}); install it with `pip install "rllm[ray]"` to run '
                          "rollouts on Ray workers") from None
    return ray


def _split_host_port(address: str, shown: str) -> tuple[str, int]:
    """'host:port', '[v6]:port' or 'ray://host:port' → (host, port); ConfigError naming `shown` otherwise."""
    rest = address.split("://", 1)[1] if "://" in address else address
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {shown!r} is not an address Ray can connect to: give 'auto', "
                          "'host:port' (the head node's GCS port, 6379 by default) or 'ray://host:port'")
    return host.strip("[]"), int(port)


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client server)
answers with a SETTINGS frame of its own; a web server or anything else does not."""


def _probe(host: str, port: int, shown: str, timeout_s: float) -> None:
    """A TCP connect to host:port and a gRPC handshake within timeout_s, or a ConfigError naming the address.

    The handshake matters: on a port where something that is not Ray listens (the dashboard's 8265, a
    model server), `ray.init` retries its GCS connection for minutes instead of failing."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return  # a TLS cluster expects a TLS hello first: the connect is all we can check
            sock.sendall(_H2_PREFACE)
            head = sock.recv(9)
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise ConfigError(f"Ray cluster at --ray-address {shown} is not reachable ({host}:{port}: {reason}). "
                          "Start it with `ray start --head`, fix the address, or omit --ray-address to run "
                          "a local cluster for this run") from None
    if len(head) < 4 or head[3] != 0x04:  # frame type 4 = SETTINGS
        raise ConfigError(f"--ray-address {shown}: something answers at {host}:{port}, but it is not a Ray "
                          "cluster (no gRPC handshake). Give the head node's GCS port (6379 unless "
                          "`ray start --port` chose another), or ray://host:10001 for Ray Client")


def check_ray_address(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Resolve `address` ('auto' reads RAY_ADDRESS / the last `ray start` on this machine) and probe it.

    Returns the address to hand to `ray.init`. Fast on purpose: callers run it before opening endpoints or
    loading benchmarks, so a wrong address costs seconds, not a started model server.
    """
    address = address.strip()
    if not address:
        raise ConfigError("--ray-address is empty: give 'auto', 'host:port' or 'ray://host:port'")
    target = address
    if address == "auto":
        import_ray()
        try:
            from ray._private.services import get_ray_address_from_environment

            # RAY_ADDRESS, else the last `ray start` here, as written (Ray's canonical form would turn a
            # loopback address into this machine's network address, where a loopback cluster is not)
            target = str(get_ray_address_from_environment("auto", None))
        except ImportError:  # a Ray without this private helper: let ray.init find the cluster itself
            return address
        except (ConnectionError, ValueError) as exc:
            raise ConfigError(f"--ray-address auto found no running Ray cluster on this machine ({exc}). "
                              "Start one with `ray start --head`, or omit --ray-address for a local "
                              "cluster") from None
    host, port = _split_host_port(target, address if target == address else f"{address} ({target})")
    _probe(host, port, address if target == address else f"{address} ({target})", timeout_s)
    return target


def _cluster_info(ray: Any, address: str, local: bool, owned: bool) -> RayConnection:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_ip = ray.util.get_node_ip_address()
    return RayConnection(address=address, local=local, owned=owned,
                         cpus=float(ray.cluster_resources().get("CPU", 0.0)), node_ip=node_ip,
                         node_ips=tuple(str(n.get("NodeManagerAddress")) for n in nodes))


@contextmanager
def _loopback_stays_loopback(enabled: bool = True) -> Iterator[None]:
    """While Ray starts or connects, keep 127.0.0.1 as 127.0.0.1.

    Ray turns a loopback node address into the machine's network address unless it believes clusters are
    off (its Windows/macOS default). That flag is turned off just for the `ray.init` call: a cluster that
    exists for one run then listens on loopback only, not on every interface, and a driver given
    127.0.0.1:port reaches a loopback cluster where it listens.
    """
    try:
        from ray._private import ray_constants
    except ImportError:
        ray_constants = None
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    patch = enabled and ray_constants is not None and saved is not None
    if patch:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if patch:
            ray_constants.ENABLE_RAY_CLUSTER = saved


@contextmanager
def connect_ray(address: str | None, num_cpus: int | None = None, *,
                probe_timeout_s: float = PROBE_TIMEOUT_S) -> Iterator[RayConnection]:
    """Ray for the duration of a `with` block; always shut down (or disconnected) on exit, failure included.

    - `address=None`: start a local cluster (on 127.0.0.1, `num_cpus` CPUs, default all) and stop it after.
      RAY_ADDRESS is not consulted: None means "a cluster of our own", pass "auto" to use a running one.
    - `address="auto" | "host:port" | "ray://host:port"`: connect to that cluster (probed first, see
      `check_ray_address`) and only disconnect after; `num_cpus` is ignored (the cluster has its own).
    - Ray already initialized by the caller: it is used as it is and left running.

    Raises ConfigError for an unreachable or malformed address, a cluster that refuses the connection,
    or Ray not being installed.
    """
    ray = import_ray()
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError(f"num_cpus must be at least 1 (got {num_cpus})")
    if ray.is_initialized():
        yield _cluster_info(ray, "existing", local=False, owned=False)
        return
    if address is None:
        shown = "local"
        try:
            with _loopback_stays_loopback():
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         _node_ip_address=LOCAL_HOST, logging_level=logging.WARNING)
        except BaseException:
            ray.shutdown()
            raise
    else:
        target = check_ray_address(address, probe_timeout_s)
        shown = target
        if num_cpus is not None:
            log.warning("num_cpus=%s is ignored when connecting to the existing cluster at %s", num_cpus, address)
        host = target.rpartition(":")[0].strip("[]") if "://" not in target else ""
        try:
            with _loopback_stays_loopback(host in ("127.0.0.1", "localhost", "::1")):
                ray.init(address=target, logging_level=logging.WARNING)
        except Exception as exc:
            ray.shutdown()
            hint = ' (ray:// addresses need `pip install "ray[client]"`)' if target.startswith("ray://") else ""
            raise ConfigError(f"could not connect to the Ray cluster at --ray-address {address}: "
                              f"{type(exc).__name__}: {str(exc).strip()[:500]}{hint}") from None
    try:
        yield _cluster_info(ray, shown, local=address is None, owned=True)
    finally:
        ray.shutdown()
