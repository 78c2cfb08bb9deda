"""The rollout worker: an async Ray actor that runs episodes of one rollout against the driver's gateway.

A plain class here (no `import ray` at module level): `run_episodes_ray` wraps it with `ray.remote` at run
time, and Ray imports this module by name in the worker process. Tasks go in and Episodes come out as JSON,
so the records that cross the process boundary are exactly what `Episode.model_validate_json` checks.
Plugins' `rllm_on_episode_end` runs here (where adapters' call logs live); `rllm_on_llm_call` does not: the
driver sends it for each Step of the episodes that come back.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import Any

import httpx

from rllm_core.context import steps_reported_by_driver
from rllm_core.types import Episode, Task
from rllm_rollout.rollout import Rollout

__all__ = ["GATEWAY_CHECK_TIMEOUT_S", "RolloutWorker", "failed_episode_json"]

GATEWAY_CHECK_TIMEOUT_S = 5.0
"""How long a starting worker may take to reach the gateway's /health before it reports it unreachable."""


def failed_episode_json(task_json: str, attempt: int, rollout: str, error: str) -> str:
    """An error Episode for a task, as JSON (what `run` returns when the rollout machinery itself fails)."""
    task = Task.model_validate_json(task_json)
    ep = Episode(task=task, attempt=attempt, rollout=rollout, termination_reason="error", error=error)
    return ep.model_dump_json()


class RolloutWorker:
    """Runs `rollout.arun` for one task at a time per call; Ray runs up to max_concurrency calls at once.

    Each episode records through `gateway` (a `RemoteGateway` of the driver's gateway), with this process's
    own capture context (`arun` opens one per episode), so token ids come from the upstream as in-process.
    """

    def __init__(self, rollout: Rollout, gateway: Any, model: str, sampling: dict[str, Any] | None,
                 timeout_s: float | None, api_key: str | None, tokenizer: str | None) -> None:
        self.rollout = rollout
        self.gateway = gateway
        self.model = model
        self.sampling = dict(sampling or {})
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.tokenizer = tokenizer

    async def ready(self) -> dict[str, Any]:
        """Who this worker is, and whether it reaches the gateway: checked once before any episode runs, so a
        gateway the cluster cannot reach (127.0.0.1 seen from another node) fails the run with its URL."""
        info: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "node": _node_address(),
                                "gateway_error": None}
        url = f"{self.gateway.url}/health"
        try:
            async with httpx.AsyncClient(timeout=GATEWAY_CHECK_TIMEOUT_S) as client:
                resp = await client.get(url)
            if resp.status_code != 200:
                info["gateway_error"] = f"GET {url} answered HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            info["gateway_error"] = f"GET {url} failed: {type(exc).__name__}: {exc}"
        return info

    async def run(self, task_json: str, attempt: int) -> str:
        """One episode; never raises for the agent's own failures (they are in the Episode, as in-process)."""
        try:
            task = Task.model_validate_json(task_json)
            with steps_reported_by_driver():  # the driver sends rllm_on_llm_call when the episode reaches it
                ep = await self.rollout.arun(task, gateway=self.gateway, model=self.model, api_key=self.api_key,
                                             sampling=self.sampling, timeout_s=self.timeout_s, attempt=attempt,
                                             tokenizer=self.tokenizer)
            return ep.model_dump_json()
        except Exception as exc:
            text = "".join(traceback.format_exception(exc))
            return failed_episode_json(task_json, attempt, self.rollout.name, text)


def _node_address() -> str:
    """The Ray node's address this worker runs on (hosts may share a hostname, never a node address)."""
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # not in Ray (a test calling the class directly)
        return socket.gethostname()
