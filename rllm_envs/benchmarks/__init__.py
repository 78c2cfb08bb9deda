"""Benchmarks: named sources of Tasks with their graders and default rollouts.

    get_benchmark(name) -> Benchmark         unknown names get close matches
    list_benchmarks() -> list[Benchmark]     everything registered through `rllm_register_benchmarks`
    Benchmark                                subclass it (load + grade) to add your own, from any plugin
Each Benchmark has `name, category, reward, offline, load(split, data_dir, max_examples, seed) -> list[Task]`,
`score(task, episode) -> RewardResult` and `default_rollout() -> Rollout`.
"""

from rllm_core.rewards import RewardResult
from rllm_envs.benchmarks.dataset import DatasetBenchmark
from rllm_rollout.benchmarks.base import Benchmark, last_finish_reason, response_text
from rllm_rollout.benchmarks.data import DATA_DIR_ENV, resolve_data_dir
from rllm_rollout.benchmarks.registry import get_benchmark, list_benchmarks, reset_benchmarks

__all__ = [
    "DATA_DIR_ENV",
    "Benchmark",
    "DatasetBenchmark",
    "RewardResult",
    "get_benchmark",
    "last_finish_reason",
    "list_benchmarks",
    "reset_benchmarks",
    "resolve_data_dir",
    "response_text",
]
