"""Where Ray workers reach the driver's gateway: loopback on one machine, the driver's cluster address otherwise.

On a single-node cluster the gateway stays on 127.0.0.1. When the cluster has other nodes, their workers need
a routable address: the gateway then listens on every interface and workers are handed the driver's node IP.
Either way it has a random bearer token (so only this run's workers can record through it and spend the
upstream's key), which the picklable client carries to the workers. `rllm eval` and `rllm train` both choose
through these functions.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rllm_rollout.distributed.ray_cluster import RayConnection
    from rllm_rollout.gateway import GatewayHandle, RemoteGateway

__all__ = ["worker_gateway_bind", "worker_gateway_client", "worker_gateway_host"]


def worker_gateway_host(conn: RayConnection | None) -> str:
    """Where a gateway that Ray workers of `conn` must reach binds: loopback unless other nodes run workers."""
    return "127.0.0.1" if conn is None or conn.single_node else "0.0.0.0"


def worker_gateway_bind(conn: RayConnection | None) -> tuple[str, str]:
    """(host to bind, bearer token) for a gateway that Ray workers of `conn` must reach."""
    return worker_gateway_host(conn), secrets.token_urlsafe(24)


def worker_gateway_client(handle: GatewayHandle, conn: RayConnection | None) -> RemoteGateway:
    """The picklable client Ray workers use to record through `handle` (it carries the token and takes with
    retries across a gateway restart, like any `RemoteGateway`)."""
    from rllm_core.net import client_host
    from rllm_rollout.gateway import RemoteGateway

    if conn is None or conn.single_node:
        return handle.remote()
    return RemoteGateway(f"http://{client_host(conn.node_ip)}:{handle.port}", api_key=handle.client_api_key)
