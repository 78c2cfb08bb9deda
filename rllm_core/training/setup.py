"""What a run trains on: the benchmark (tasks + reward) and the rollout function (the agent)."""

from __future__ import annotations

import importlib
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.rollout import Rollout, as_rollout
from rllm_core.training.config import TrainConfig

__all__ = ["load_agent", "resolve_benchmark", "resolve_rollout"]


def resolve_benchmark(config: TrainConfig, benchmark: Any = None) -> Any:
    """The named (or given) benchmark; it must have a reward unless the agent scores itself (workflow 'none')."""
    if benchmark is None:
        from rllm_core.benchmarks import get_benchmark

        benchmark = get_benchmark(config.benchmark)
    bench = benchmark
    if config.workflow != "none" and not getattr(bench, "reward", None):
        raise ConfigError(f"benchmark {config.benchmark!r} has no reward function, so there is nothing to learn "
                          "from: pick a benchmark with a reward (`rllm bench list`), or pass --agent with "
                          "--workflow none and set episode.reward in your agent")
    return bench


def load_agent(spec: str) -> Rollout:
    """'module:function' → Rollout."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--agent {spec!r} must look like 'my_pkg.agents:solve' (module, colon, function)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--agent {spec!r}: cannot import {module_name!r} ({exc}); is it on PYTHONPATH?") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"--agent {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return as_rollout(obj)


def resolve_rollout(config: TrainConfig, benchmark: Any) -> Rollout:
    """--agent when given, else the benchmark's default rollout."""
    if config.agent:
        return load_agent(config.agent)
    return benchmark.default_rollout()
