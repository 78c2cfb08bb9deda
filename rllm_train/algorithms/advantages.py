"""Advantage estimators: one reward per trajectory in, one advantage per trajectory out.

Shapes: `rewards_B` is [B] (one scalar reward per trajectory / train row), `group_ids` has B hashables; rows
with the same group id are n attempts at the same task by the same role. Semantics follow verl 0.9's
`verl.trainer.ppo.core_algos` outcome estimators, with the differences stated per estimator:

- ``grpo``      A_i = (r_i − mean_g) / (std_g + ε), ε = 1e-6, std_g the *unbiased* torch.std (as verl).
                Singleton groups give 0 (verl uses mean 0, std 1 there, i.e. A = r/(1+ε); a lone sample has no
                baseline, so we give it no signal rather than the raw reward).
- ``dr_grpo``   A_i = r_i − mean_g (Dr. GRPO: no std normalisation; verl's `norm_adv_by_std_in_grpo=False`).
- ``rloo``      A_i = n/(n−1) · (r_i − mean_g) = r_i − mean of the other n−1 rewards (verl's RLOO).
- ``reinforce`` A_i = r_i (no baseline).
- ``reinforce_plus_plus_baseline``  A_i = r_i − mean_g, then whitened over the batch:
                (A − mean_B) / sqrt(var_B + 1e-8) with unbiased var_B. verl whitens over response tokens
                (longer responses weigh more); pass `weights_B` (e.g. response lengths) to reproduce that.

For all group estimators a group of one row gives 0 (for reinforce++ before the batch whitening): use
`requires_groups(estimator)` to reject group size 1 up front.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence

import torch

from rllm_core.errors import ConfigError
from rllm_core.types import TrajectoryGroup
from rllm_train.algorithms.names import ESTIMATORS, check_estimator, requires_groups

__all__ = ["ESTIMATORS", "compute_advantages", "estimator_for_role", "group_advantages", "requires_groups"]

EPS = 1e-6


def estimator_for_role(role: str, estimator: str | Mapping[str, str], default: str = "grpo") -> str:
    """Resolve a per-role estimator map (e.g. {"solver": "grpo", "judge": "reinforce"}); "*" is the fallback."""
    if isinstance(estimator, str):
        return estimator
    return estimator.get(role, estimator.get("*", default))


def _group_index(group_ids: Sequence[Hashable]) -> torch.Tensor:
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(g, len(index)) for g in group_ids], dtype=torch.long)


def compute_advantages(
    estimator: str,
    rewards: torch.Tensor | Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    weights_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages [B] for `rewards` [B] grouped by `group_ids` (see the module docstring for formulas)."""
    check_estimator(estimator)
    rewards_B = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if rewards_B.numel() != len(group_ids):
        raise ConfigError(f"compute_advantages: {rewards_B.numel()} rewards but {len(group_ids)} group ids")
    if rewards_B.numel() == 0:
        return torch.zeros(0, dtype=torch.float32)
    if estimator == "reinforce":
        return rewards_B.float()

    gidx_B = _group_index(group_ids)
    n_groups = int(gidx_B.max()) + 1
    count_G = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gidx_B, torch.ones_like(rewards_B))
    mean_G = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gidx_B, rewards_B) / count_G
    centered_B = rewards_B - mean_G[gidx_B]
    n_B = count_G[gidx_B]
    single_B = n_B < 2

    if estimator == "grpo":
        sq_G = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gidx_B, centered_B**2)
        std_G = torch.sqrt(sq_G / (count_G - 1).clamp(min=1))  # unbiased, as torch.std in verl
        adv_B = centered_B / (std_G[gidx_B] + EPS)
    elif estimator == "dr_grpo":
        adv_B = centered_B
    elif estimator == "rloo":
        adv_B = centered_B * n_B / (n_B - 1).clamp(min=1)
    else:  # reinforce_plus_plus_baseline
        adv_B = centered_B.masked_fill(single_B, 0.0)
        adv_B = _whiten(adv_B, weights_B)
        return adv_B.float()
    return adv_B.masked_fill(single_B, 0.0).float()


def _whiten(x_B: torch.Tensor, weights_B: torch.Tensor | None) -> torch.Tensor:
    """(x − mean)/sqrt(var + 1e-8), unbiased variance, optionally weighted (verl's masked_whiten over tokens)."""
    if x_B.numel() < 2:
        return torch.zeros_like(x_B)
    w_B = torch.ones_like(x_B) if weights_B is None else torch.as_tensor(weights_B, dtype=x_B.dtype).flatten()
    total = w_B.sum()
    mean = (x_B * w_B).sum() / total
    var = ((x_B - mean) ** 2 * w_B).sum() / total
    var = var * total / (total - 1)  # Bessel's correction, as verl's masked_var(unbiased=True)
    return (x_B - mean) * torch.rsqrt(var + 1e-8)


def group_advantages(
    groups: Sequence[TrajectoryGroup], estimator: str | Mapping[str, str] = "grpo"
) -> dict[str, float]:
    """Trajectory id → advantage. Groups sharing an estimator are computed together, so a batch-level
    estimator (reinforce++ baseline whitening) whitens over those trajectories only, not over other roles'."""
    by_estimator: dict[str, list[TrajectoryGroup]] = defaultdict(list)
    for g in groups:
        by_estimator[estimator_for_role(g.role, estimator)].append(g)
    out: dict[str, float] = {}
    for name, gs in by_estimator.items():
        ids = [t.id for g in gs for t in g.trajectories]
        rewards = [r for g in gs for r in g.rewards]
        gids = [g.group_id for g in gs for _ in g.trajectories]
        out.update(zip(ids, compute_advantages(name, rewards, gids).tolist(), strict=True))
    return out
