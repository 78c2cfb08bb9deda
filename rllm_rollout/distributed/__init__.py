"""Rollouts on Ray: episodes run in Ray actors, recorded through the driver's gateway.

    with connect_ray(None, num_cpus=2) as conn:          # a local cluster for the run (or "auto", "host:port")
        eps = await run_episodes_ray(rollout, tasks, workers=4, gateway=gateway.remote(), model="m")
    eps.stats                                            # RayRunStats: retried, lost, worker deaths

Ray is imported only when one of these is called, so `import rllm_rollout.distributed` never imports it.
"""

from rllm_rollout.distributed.ray_cluster import RayConnection, check_ray_address, connect_ray
from rllm_rollout.distributed.ray_gateway import worker_gateway_bind, worker_gateway_client
from rllm_rollout.distributed.ray_rollouts import RayEpisodes, RayRunStats, run_episodes_ray

__all__ = ["RayConnection", "RayEpisodes", "RayRunStats", "check_ray_address", "connect_ray", "run_episodes_ray",
           "worker_gateway_bind", "worker_gateway_client"]
