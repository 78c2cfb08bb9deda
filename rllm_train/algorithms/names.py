"""The algorithm names, torch-free: config validation and the CLI check names without loading torch."""

from __future__ import annotations

from rllm_core.errors import ConfigError

__all__ = ["AGG_MODES", "ESTIMATORS", "GROUP_ESTIMATORS", "LOSSES", "REJECTION_MODES", "parse_threshold",
           "requires_groups"]

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline")
GROUP_ESTIMATORS = frozenset({"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"})
LOSSES = ("ppo", "importance_sampling", "gspo", "sft")
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
REJECTION_MODES = ("none", "episode", "group")


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")


def requires_groups(estimator: str) -> bool:
    """True when the estimator needs ≥ 2 attempts per task to produce any signal."""
    check_estimator(estimator)
    return estimator in GROUP_ESTIMATORS


def parse_threshold(spec: str | float) -> tuple[float, float | None]:
    """(upper, lower or None): "2.0" (or 2.0) truncates at 2; "0.5_2.0" masks outside [0.5, 2] (verl's syntax)."""
    if isinstance(spec, bool):
        raise ConfigError("the importance-weight threshold is a number ('2.0') or a range ('0.5_2.0'), not a bool")
    text = str(spec).strip()
    try:
        lower, upper = (float(x) for x in text.split("_", 1)) if "_" in text else (None, float(text))
    except ValueError:
        raise ConfigError(f"importance-weight threshold {spec!r}: write a number ('2.0') or a range "
                          "('0.5_2.0')") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ConfigError(f"importance-weight threshold {spec!r}: bounds must be positive and lower <= upper")
    return upper, lower
