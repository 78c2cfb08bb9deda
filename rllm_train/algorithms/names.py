"""The algorithm names, torch-free: config validation and the CLI check names without loading torch."""

from __future__ import annotations

from rllm_core.errors import ConfigError

__all__ = ["AGG_MODES", "ESTIMATORS", "GROUP_ESTIMATORS", "LOSSES", "REJECTION_MODES", "requires_groups"]

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline")
GROUP_ESTIMATORS = frozenset({"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"})
LOSSES = ("ppo", "importance_sampling", "gspo")
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
REJECTION_MODES = ("none", "episode", "group")


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")


def requires_groups(estimator: str) -> bool:
    """True when the estimator needs ≥ 2 attempts per task to produce any signal."""
    check_estimator(estimator)
    return estimator in GROUP_ESTIMATORS
