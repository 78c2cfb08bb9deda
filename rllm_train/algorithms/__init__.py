"""RL algorithms in pure torch: advantage estimators, policy losses, loss aggregation, rejection sampling.

Nothing here knows about models, servers or files: tensors and records in, tensors and metrics out.
Names resolve lazily so that `rllm --help` and config validation (which only need `names`) never load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AGG_MODES",
    "ESTIMATORS",
    "LOSSES",
    "REJECTION_MODES",
    "agg_loss",
    "classify_rewards",
    "compute_advantages",
    "estimator_for_role",
    "filter_groups",
    "group_advantages",
    "kl_penalty",
    "policy_loss",
    "policy_loss_with_metrics",
    "requires_groups",
]

_HOME = {
    "AGG_MODES": "names", "ESTIMATORS": "names", "LOSSES": "names", "REJECTION_MODES": "names",
    "requires_groups": "names",
    "compute_advantages": "advantages", "estimator_for_role": "advantages", "group_advantages": "advantages",
    "classify_rewards": "filters", "filter_groups": "filters",
    "agg_loss": "losses", "kl_penalty": "losses", "policy_loss": "losses", "policy_loss_with_metrics": "losses",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'rllm_train.algorithms' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rllm_train.algorithms.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
