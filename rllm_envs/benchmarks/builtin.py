"""The built-in benchmarks, in one list (the plugin module hands it to the registry)."""

from __future__ import annotations

from rllm_envs.benchmarks.arithmetic import arithmetic_benchmarks
from rllm_envs.benchmarks.frozenlake import FrozenLake
from rllm_envs.benchmarks.geometry_figures import GeometryFigures
from rllm_envs.benchmarks.geometry_shapes import GeometryShapes
from rllm_envs.benchmarks.hub_sets import hub_benchmarks
from rllm_envs.benchmarks.humaneval import HumanEval
from rllm_envs.benchmarks.math_sets import math_benchmarks
from rllm_envs.benchmarks.reasoning_gym_tasks import reasoning_gym_benchmarks
from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["builtin_benchmarks"]


def builtin_benchmarks() -> list[Benchmark]:
    return [
        *math_benchmarks(),
        *hub_benchmarks(),
        HumanEval(),
        FrozenLake(3),  # 12 turns at most: a multi-turn task a 135M model learns on a CPU in minutes
        FrozenLake(4),
        FrozenLake(8),
        *arithmetic_benchmarks(),
        GeometryFigures(),  # images in the prompt, drawn offline
        GeometryShapes(),  # the same figures, named: chance 0.25, so learning shows
        *reasoning_gym_benchmarks(),
    ]
