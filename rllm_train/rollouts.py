"""The rollout stage of training: a step's episodes against the backend's current policy.

One gateway serves the whole run, in front of every replica of the backend's `PolicyEndpoint` (sticky
sessions spread episodes over them); when a sync moves the replicas, the gateway takes the new set. The
episodes run wherever the rollout executor puts them (rllm_rollout.executor: this process, or with
`rollout_workers > 0` Ray actors that reach the same gateway over the network). Around every batch of
rollouts the backend's lifecycle hooks run: `before_rollouts` wakes a colocated engine, `after_rollouts`
frees it for the update.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Sequence
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.types import Episode, Task
from rllm_rollout.executor import EpisodeBatch, RayExecutor, RolloutExecutor, open_executor
from rllm_rollout.gateway.client import RemoteGateway
from rllm_rollout.rollout import Rollout, derive_seed
from rllm_train.backend import Backend, PolicyEndpoint
from rllm_train.config import TrainConfig

__all__ = ["RolloutStage"]

log = logging.getLogger("rllm.train")


class RolloutStage:
    """Owns the run's gateway and rollout executor; `await stage.run(tasks, attempts)` gives scored episodes.
    Use it as a context manager: leaving it stops the gateway and, for a cluster it started, Ray.
    `executor`: run the episodes there instead of where --rollout-workers says (a test double, a plugin's)."""

    def __init__(self, config: TrainConfig, rollout: Rollout, benchmark: Any, backend: Backend,
                 executor: RolloutExecutor | None = None) -> None:
        self.config, self.rollout, self.benchmark, self.backend = config, rollout, benchmark, backend
        self._gateway: Any = None
        self._stack = contextlib.ExitStack()
        self.executor: RolloutExecutor | None = executor

    @property
    def ray_stats(self) -> dict[str, int]:
        """Running totals over the run (episodes retried / lost when a Ray worker died), logged as ray/*."""
        if isinstance(self.executor, RayExecutor):
            return dict(self.executor.stats)
        return {"retried": 0, "lost": 0, "worker_deaths": 0}

    def __enter__(self) -> RolloutStage:
        if self.executor is None:
            self.executor = self._stack.enter_context(open_executor(self.config.rollout_workers,
                                                                    self.config.ray_address))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._gateway is not None:
            if isinstance(self._gateway, RemoteGateway):
                self._gateway.close()  # a client of a gateway someone else runs
            else:
                self._gateway.stop()
            self._gateway = None
        self._stack.close()

    def _gateway_for(self, endpoint: PolicyEndpoint) -> Any:
        """The run's gateway, pointed at the endpoint's replicas (started on first use); or with --gateway the
        one on its own host, whose --upstream was set where it runs."""
        from rllm_rollout.gateway import start_gateway

        if self.config.gateway:
            if self._gateway is None:
                url, token = self.config.gateway.rstrip("/").removesuffix("/v1"), os.environ.get("RLLM_GATEWAY_API_KEY")
                if not token:
                    raise ConfigError(f"--gateway {url}: set RLLM_GATEWAY_API_KEY to that gateway's token (its "
                                      "--api-key), which taking its sessions needs")
                self._gateway = RemoteGateway(url, api_key=token)
            return self._gateway
        upstreams = endpoint.upstream_configs()
        if self._gateway is None:  # loopback, unless the executor's workers on other nodes must reach it
            assert self.executor is not None, "use the RolloutStage as a context manager"
            self._gateway = start_gateway(upstreams, host=self.executor.gateway_host,
                                          api_key=secrets.token_urlsafe(24))
        elif upstreams != self._gateway.config.upstreams:
            log.info("policy replicas changed: %s → %s", ", ".join(u.url for u in self._gateway.config.upstreams),
                     ", ".join(u.url for u in upstreams))
            self._gateway.set_upstreams(upstreams)
        return self._gateway

    async def run(self, tasks: Sequence[Task], attempts: int, greedy: bool = False) -> list[Episode]:
        """Episodes of `tasks` × `attempts` at the training temperature (or greedy), scored."""
        config = self.config
        self.backend.before_rollouts()  # first: a backend's replicas may move when they wake
        try:
            endpoint = self.backend.policy_endpoint()
            gateway = self._gateway_for(endpoint)
            scorer = None if config.workflow == "none" else self.benchmark
            # The batch's seed: (run seed, the policy version sampling it, the batch's tasks) stands for (seed, step),
            # and all of it is restored by a resume, so a resumed run draws what the uninterrupted one would have.
            # Each episode derives its own from it (task id, attempt), and each call from that (call index).
            batch_seed = derive_seed(config.seed, endpoint.policy_version, greedy, *(t.id for t in tasks))
            sampling = {"temperature": 0.0 if greedy else config.temperature, "top_p": config.top_p,
                        "max_tokens": config.max_tokens, "seed": batch_seed}
            assert self.executor is not None
            episodes = await self.executor.run(EpisodeBatch(
                self.rollout, list(tasks), model=endpoint.model, gateway=gateway, attempts=attempts,
                concurrency=config.concurrency, sampling=sampling, benchmark=scorer,
                timeout_s=config.episode_timeout_s, tokenizer=endpoint.tokenizer))
        finally:
            self.backend.after_rollouts()
        if scorer is None:  # the agent scores itself: its Episode.reward, or artifacts["reward"]
            _self_scored(episodes)
        return episodes


def _self_scored(episodes: list[Episode]) -> None:
    """Rewards for `--workflow none`; episodes that carry none count 0, and the first time it happens the
    user hears of it: otherwise an agent that forgot to score trains on flat zeros without a word."""
    global _warned_no_reward
    missing = 0
    for ep in episodes:
        if ep.reward is None:
            value = ep.artifacts.get("reward")
            ep.reward = float(value) if isinstance(value, int | float) else 0.0
            ep.reward_reason = ep.reward_reason or ("agent_reward" if value is not None else "no_reward")
            missing += value is None
    if missing and not _warned_no_reward:
        _warned_no_reward = True
        log.warning("--workflow none: %d of %d episodes set no reward (Episode.reward or artifacts['reward']); "
                    "they count as 0 (metrics: reason/no_reward)", missing, len(episodes))


_warned_no_reward = False
