"""What a run trains on: the benchmark (tasks + reward), the rollout function (the agent), and the benchmark's
recommended settings for the options the user left unset."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rllm_core.errors import ConfigError
from rllm_rollout.agent_loader import load_agent
from rllm_rollout.benchmarks.base import recommended_unset
from rllm_rollout.rollout import Rollout
from rllm_train.config import TrainConfig, load_config
from rllm_train.roles import check_role_names

__all__ = ["apply_benchmark_defaults", "check_declared_roles", "load_agent", "per_role_options", "resolve_benchmark",
           "resolve_init", "resolve_rollout"]

log = logging.getLogger("rllm.train")


def resolve_init(config: TrainConfig) -> TrainConfig:
    """With `--init`, the config whose `model` is the directory the weights load from (the run's newest
    checkpoint, or the step named): what the backend loads and config.yaml records; `init` keeps what was given."""
    if not config.init:
        return config
    if config.backend == "tinker":
        raise ConfigError(f"--init {config.init} loads weights from this machine, but the tinker backend trains a "
                          "model Tinker hosts: start from a Tinker checkpoint with --model, or drop --init")
    from rllm_serve.run_model import resolve_checkpoint

    ckpt = resolve_checkpoint(config.init)
    if ckpt is None:
        ckpt = Path(config.init).expanduser()
        if not (ckpt / "config.json").is_file():
            raise ConfigError(f"--init {config.init}: not a run of rllm sft / rllm train, a checkpoint or a model "
                              "directory (config.json); give one of those, or use --model for a model name")
    return config.model_copy(update={"model": str(ckpt)})


def resolve_benchmark(config: TrainConfig, benchmark: Any = None) -> Any:
    """The named (or given) benchmark; it must have a reward unless the agent scores itself (workflow 'none')."""
    if benchmark is None:
        from rllm_envs.benchmarks import get_benchmark

        benchmark = get_benchmark(config.benchmark)
    bench = benchmark
    if config.reward or config.judge or config.rubric:
        from rllm_envs.rewards.reward_mix import with_reward

        bench = with_reward(bench, config.reward, config.judge, config.rubric)
    if config.workflow != "none" and not getattr(bench, "reward", None):
        raise ConfigError(f"benchmark {config.benchmark!r} has no reward function, so there is nothing to learn "
                          "from: pick a benchmark with a reward (`rllm bench list`), or pass --agent with "
                          "--workflow none and set episode.reward in your agent")
    return bench


def resolve_rollout(config: TrainConfig, benchmark: Any) -> Rollout:
    """--agent when given (a 'module:function', or a name the benchmark knows), else the benchmark's default
    rollout; wrapped by the benchmark (a sandboxed one runs each episode in a `--sandbox` sandbox)."""
    if config.harness:
        from rllm_harnesses.rollout import harness_rollout

        rollout = harness_rollout(config.harness)
    elif config.named_workflow:
        from rllm_envs.workflows import get_workflow

        rollout = get_workflow(config.named_workflow)
    elif config.agent:
        lookup = getattr(benchmark, "named_agent", None)
        named = lookup(config.agent) if lookup is not None and ":" not in config.agent else None
        rollout = named or load_agent(config.agent)
    else:
        rollout = benchmark.default_rollout()
    check_declared_roles(config, rollout)
    wrap = getattr(benchmark, "wrap_rollout", None)
    return wrap(rollout, sandbox=config.sandbox) if wrap is not None else rollout


def per_role_options(config: TrainConfig) -> dict[str, dict[str, Any]]:
    """The per-role options that name roles: estimator (when a map), role_weights, roles."""
    options: dict[str, dict[str, Any]] = {"estimator": config.algo} if isinstance(config.algo, dict) else {}
    return {**options, "role_weights": config.role_weights, "roles": config.roles}


def check_declared_roles(config: TrainConfig, rollout: Rollout) -> None:
    """A workflow that declares its roles (the built-in ones do) gets its per-role options checked now, before
    any model loads; a user's agent is checked once its first episodes show which roles it has."""
    declared = getattr(rollout, "roles", None)
    if declared:
        check_role_names(per_role_options(config), declared, f"workflow {rollout.name!r}")


def apply_benchmark_defaults(config: TrainConfig, benchmark: Any) -> tuple[TrainConfig, dict[str, Any]]:
    """The config with the benchmark's recommendations (`benchmark.train_defaults`, a mapping of TrainConfig
    names, e.g. a short `max_tokens` for one-number answers) for every option the user did not set; and what
    was applied. Precedence: TrainConfig defaults < benchmark < config file < flags (a resumed run's saved
    config sets every option, so it is never changed)."""
    applied = recommended_unset(getattr(benchmark, "train_defaults", None) or {}, TrainConfig.model_fields,
                                config.model_fields_set, config.benchmark, "training")
    if not applied:
        return config, {}
    return load_config(None, **{**config.model_dump(exclude_unset=True), **applied}), applied
