"""Harbor task sets (Terminal-Bench 2's format): load task directories, run sandboxed episodes, score by verifier.

    from rllm_envs.harbor import HarborBenchmark, load_tasks, run_harbor_episode

`rllm eval harbor:PATH` runs a directory of tasks; `--agent oracle` / `--agent nop` validate it.
"""

from rllm_envs.harbor.agents import AGENTS, harbor_task_of, nop, oracle
from rllm_envs.harbor.benchmark import HarborBenchmark
from rllm_envs.harbor.episode import HarborEpisode, HarborVerdict, run_harbor_episode
from rllm_envs.harbor.task import (
    HarborTask,
    HarborTaskConfig,
    HarborTaskError,
    HarborTaskWarning,
    load_task,
    load_tasks,
    to_environment_spec,
)

__all__ = ["AGENTS", "HarborBenchmark", "HarborEpisode", "HarborTask", "HarborTaskConfig", "HarborTaskError",
           "HarborTaskWarning", "HarborVerdict", "harbor_task_of", "load_task", "load_tasks", "nop", "oracle",
           "run_harbor_episode", "to_environment_spec"]
