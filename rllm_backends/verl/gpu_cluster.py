"""verl's own GPU machinery, assembled for rllm: the hybrid-engine actor/rollout worker group on Ray, its
vLLM/SGLang server replicas, and its checkpoint engine for weight sync.

This mirrors what ``RayPPOTrainer.init_workers`` (``verl/trainer/ppo/ray_trainer.py:772-981``) builds for the
actor, minus everything rllm does itself (datasets, reward loop, agent loop manager, critic): rollouts come
from rllm's gateway, which sends them to the replicas' OpenAI servers (`server_urls`); advantages are rllm's.

    ResourcePoolManager({"global_pool": [n_gpus_per_node] * nnodes}) → RayWorkerGroup of
    ActorRolloutRefWorker (role actor_rollout) → init_model → LLMServerManager.create (the replicas)
    → CheckpointEngineManager(actor_wg, replicas) (hybrid engine: weights move with verl's own sync)

Per step the backend calls `wake` (replicas hold weights + KV cache), rollouts run, `sleep` frees the
replicas' memory, `update(batch_td)` runs verl's update, `sync(step)` pushes the new weights into the
replicas (``CheckpointEngineManager.update_weights``, which also wakes them). Needs GPUs, vLLM or SGLang and
verl's full install; nothing here is imported on CPU-only paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rllm_core.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["VerlGpuCluster", "check_gpus", "pad_to_multiple"]

ACTOR_ROLE = "actor_rollout"


def check_gpus(needed: int, available: float) -> None:
    """Refuse, with both numbers, a run that asks for more GPUs than the Ray cluster has."""
    if needed > available:
        raise ConfigError(f"--n-gpus asks for {needed} GPU(s) but the Ray cluster has {available:g}: lower "
                          "--n-gpus (GPUs per node × --nnodes), or add GPU nodes to the cluster")


class VerlGpuCluster:
    """The actor worker group, replicas and checkpoint engine of one verl config (see the module docstring)."""

    def __init__(self, config: DictConfig, seed: int = 0) -> None:
        import ray
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager
        from verl.single_controller.ray.base import create_colocated_worker_cls
        from verl.trainer.ppo.utils import Role  # not ray_trainer: it imports torchdata
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.engine_workers import ActorRolloutRefWorker
        from verl.workers.rollout.llm_server import LLMServerManager

        trainer = config.trainer
        check_gpus(int(trainer.n_gpus_per_node) * int(trainer.nnodes), float(ray.cluster_resources().get("GPU", 0)))
        self.config = config
        pools = ResourcePoolManager(resource_pool_spec={"global_pool": [int(trainer.n_gpus_per_node)]
                                                        * int(trainer.nnodes)},
                                    mapping={Role.ActorRollout: "global_pool"})
        pools.create_resource_pool()
        pool = pools.get_resource_pool(Role.ActorRollout)
        actor_cls = RayClassWithInitArgs(cls=ray.remote(ActorRolloutRefWorker), config=config.actor_rollout_ref,
                                         role=ACTOR_ROLE)
        group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(
            class_dict={ACTOR_ROLE: actor_cls}), device_name=str(trainer.device))
        self.actor_wg: Any = group.spawn(prefix_set=[ACTOR_ROLE])[ACTOR_ROLE]
        self.actor_wg.init_model()
        self.servers: Any = LLMServerManager.create(config=config, worker_group=self.actor_wg,
                                                    rollout_resource_pool=pool)
        self.checkpoints: Any = CheckpointEngineManager(
            config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine),
            actor_wg=self.actor_wg, replicas=self.servers.get_replicas())
        self.checkpoints.sleep_replicas()  # as verl does: asleep until the first sync loads the weights
        self.awake = False
        self.step = 0
        self.seed = seed
        self.dp_size = int(trainer.n_gpus_per_node) * int(trainer.nnodes)

    @property
    def server_urls(self) -> tuple[str, ...]:
        """The replicas' OpenAI-compatible base URLs (verl reports them as host:port)."""
        return tuple(f"http://{address}/v1" for address in self.servers.server_addresses)

    def wake(self) -> None:
        """Replicas ready to sample. In hybrid mode a sleeping replica has dropped its weights (vLLM sleep level 2),
        so waking is a weight load from the actor, as verl itself re-wakes (``ray_trainer.py:645-650``)."""
        if not self.awake:
            self.checkpoints.update_weights(self.step)
            self.awake = True

    def sleep(self) -> None:
        if self.awake:
            self.checkpoints.sleep_replicas()
            self.awake = False

    def sync(self, step: int) -> None:
        """verl's weight sync (hybrid engine / checkpoint engine): the replicas serve the actor's new weights. verl
        syncs into sleeping replicas (naive mode), so awake ones are put to sleep first."""
        self.step = step
        self.sleep()
        self.checkpoints.update_weights(step)
        self.awake = True

    def update(self, data: Any) -> dict[str, float]:
        """One verl update of a padded DataProto (a single mini-batch, one epoch: one optimizer step, as rllm's
        loop expects), sent the way verl's trainer sends it (``ray_trainer.py:1327-1375``)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        real = len(data)
        data = pad_to_multiple(data, self.dp_size)  # verl splits the batch evenly over its ranks
        batch_td = left_right_2_no_padding(data.to_tensordict())
        tu.assign_non_tensor(batch_td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                             global_batch_size=real, mini_batch_size=len(data), epochs=1, seed=self.seed,
                             dataloader_kwargs={"shuffle": False}, compute_loss=True)
        output = self.actor_wg.update_actor(batch_td)
        from rllm_backends.verl.worker import metric_value

        return {k: metric_value(v) for k, v in tu.get(output, "metrics").items()}  # verl's names: the backend maps them

    def save(self, path: str, step: int) -> None:
        self.actor_wg.save_checkpoint(path, hdfs_path=None, global_step=step, max_ckpt_to_keep=None)

    def load(self, path: str) -> None:
        self.actor_wg.load_checkpoint(path, hdfs_path=None, del_local_after_load=False)

    def shutdown(self) -> None:
        """Stop the replicas and workers (Ray itself belongs to whoever connected it)."""
        import ray

        if not ray.is_initialized():  # Ray already gone (its owner stopped it): so are the actors
            return
        for handle in list(getattr(self.servers, "server_handles", []) or []):
            ray.kill(handle)
        for worker in list(getattr(self.actor_wg, "workers", []) or []):
            ray.kill(worker)


def pad_to_multiple(data: Any, multiple: int) -> Any:
    """`data` with copies of its first row, loss mask and advantages zeroed, up to a multiple of `multiple` rows
    (verl chunks a batch evenly over its data-parallel ranks). The copies train nothing: token-mean losses are
    normalised by the real rows' token count, and global_batch_size stays the real row count."""
    short = -len(data) % multiple
    if short == 0:
        return data
    from verl import DataProto

    pad = data[[0] * short]
    for key in ("response_mask", "advantages"):
        pad.batch[key] = pad.batch[key] * 0
    return DataProto.concat([data, pad])
