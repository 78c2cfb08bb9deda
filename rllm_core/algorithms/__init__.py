"""RL algorithms in pure torch: advantage estimators, policy losses, loss aggregation, rejection sampling.

Nothing here knows about models, servers or files: tensors and records in, tensors and metrics out.
"""

from rllm_core.algorithms.advantages import ESTIMATORS, compute_advantages, estimator_for_role, requires_groups
from rllm_core.algorithms.filters import REJECTION_MODES, classify_rewards, filter_groups
from rllm_core.algorithms.losses import (
    AGG_MODES,
    LOSSES,
    agg_loss,
    kl_penalty,
    policy_loss,
    policy_loss_with_metrics,
)
from rllm_core.algorithms.roles import group_advantages

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
