"""Advantage estimators, policy losses and aggregation modes against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rllm_core.errors import ConfigError
from rllm_core.types import Episode, Task, Trajectory, TrajectoryGroup
from rllm_train.algorithms import (
    agg_loss,
    compute_advantages,
    filter_groups,
    group_advantages,
    kl_penalty,
    policy_loss,
    policy_loss_with_metrics,
    requires_groups,
)

R = [1.0, 0.0, 0.0, 1.0, 1.0, 5.0]
G = ["a", "a", "a", "a", "b", "c"]  # group a: 4 rows, b: 2 rows (equal?) no: b and c singletons


def _close(t: torch.Tensor, expected: list[float], tol: float = 1e-5) -> None:
    assert t.shape == (len(expected),)
    for got, want in zip(t.tolist(), expected, strict=True):
        assert got == pytest.approx(want, abs=tol), (t.tolist(), expected)


def test_grpo_unbiased_std_and_singletons_zero() -> None:
    # group a: mean 0.5, unbiased std sqrt(((.5^2)*4)/3) = sqrt(1/3) = 0.57735
    s = math.sqrt(1 / 3) + 1e-6
    _close(compute_advantages("grpo", R, G), [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0])


def test_grpo_equal_rewards_give_zero() -> None:
    _close(compute_advantages("grpo", [1.0, 1.0, 1.0], ["x"] * 3), [0.0, 0.0, 0.0])


def test_dr_grpo_is_mean_centered() -> None:
    _close(compute_advantages("dr_grpo", [3.0, 1.0, 2.0, 7.0], ["x", "x", "x", "y"]), [1.0, -1.0, 0.0, 0.0])


def test_rloo_is_leave_one_out() -> None:
    # r_i − mean of the others: 3 − 1.5 = 1.5, 1 − 2.5 = −1.5, 2 − 2 = 0
    _close(compute_advantages("rloo", [3.0, 1.0, 2.0], ["x"] * 3), [1.5, -1.5, 0.0])


def test_reinforce_is_raw_reward() -> None:
    _close(compute_advantages("reinforce", [0.3, -1.0], ["x", "y"]), [0.3, -1.0])


def test_reinforce_plus_plus_baseline_whitens_over_batch() -> None:
    rewards, gids = [1.0, 0.0, 2.0, 0.0], ["x", "x", "y", "y"]
    centered = [0.5, -0.5, 1.0, -1.0]  # group means 0.5 and 1.0
    mean = sum(centered) / 4
    var = sum((c - mean) ** 2 for c in centered) / 3
    _close(
        compute_advantages("reinforce_plus_plus_baseline", rewards, gids),
        [(c - mean) / math.sqrt(var + 1e-8) for c in centered],
    )


def test_estimator_errors_and_group_requirement() -> None:
    with pytest.raises(ConfigError, match="unknown advantage estimator"):
        compute_advantages("ppo", [1.0], ["a"])
    with pytest.raises(ConfigError, match="2 rewards but 1 group ids"):
        compute_advantages("grpo", [1.0, 2.0], ["a"])
    assert requires_groups("grpo") and requires_groups("rloo") and not requires_groups("reinforce")


def _group(gid: str, role: str, rewards: list[float]) -> TrajectoryGroup:
    trajs = [Trajectory(name=role, reward=r) for r in rewards]
    return TrajectoryGroup(group_id=gid, task_id=gid.split(":")[0], role=role, trajectories=trajs)


def test_per_role_estimator_map() -> None:
    solver = _group("t1:solver", "solver", [1.0, 0.0])
    judge = _group("t1:judge", "judge", [0.25, 1.0])
    adv = group_advantages([solver, judge], {"solver": "dr_grpo", "judge": "reinforce"})
    assert [adv[t.id] for t in solver.trajectories] == pytest.approx([0.5, -0.5])
    assert [adv[t.id] for t in judge.trajectories] == pytest.approx([0.25, 1.0])


def test_rejection_sampling_modes() -> None:
    mixed, easy, hard = _group("t1:s", "s", [1, 0]), _group("t2:s", "s", [1, 1]), _group("t3:s", "s", [0, 0])
    groups = [mixed, easy, hard]
    kept, m = filter_groups(groups, "none")
    assert kept == groups and m["groups/frac_too_easy"] == pytest.approx(1 / 3)
    assert m["groups/frac_too_hard"] == pytest.approx(1 / 3)
    kept, m = filter_groups(groups, "group")
    assert kept == [mixed] and m["groups/dropped"] == 2
    # episode mode: decided on episode rewards per task; task t3's episodes differ, so all its groups stay
    eps = [Episode(task=Task(id=t), reward=r) for t, r in [("t1", 1), ("t1", 1), ("t2", 1), ("t2", 1),
                                                           ("t3", 0), ("t3", 1)]]
    kept, _ = filter_groups(groups, "episode", eps)
    assert kept == [hard]
    with pytest.raises(ConfigError, match="rejection sampling mode"):
        filter_groups(groups, "sometimes")


# ---------------------------------------------------------------- losses
LP = torch.tensor([[0.0, math.log(1.5), math.log(0.5)], [math.log(1.1), 0.0, 0.0]])
OLD = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_ppo_clip_hand_values() -> None:
    # ratios row 0: 1, 1.5, 0.5; row 1: 1.1, 1, (masked). A = +1 for row 0, −1 for row 1, ε = 0.2.
    adv = torch.tensor([1.0, -1.0])
    loss, m = policy_loss_with_metrics("ppo", LP, OLD, adv, MASK)
    # row0: max(−r, −clip(r)) → −1, −1.2, −0.5 ; row1 (A<0): max(r, clip(r)) → 1.1, 1 ; dual clip c=3 inactive
    tokens = [-1.0, -1.2, -0.5, 1.1, 1.0]
    assert float(loss) == pytest.approx(sum(tokens) / 5, abs=1e-6)
    # only ratio 1.5 with A > 0 is clipped in effect (verl counts L2 > L1); at ratio 0.5 the unclipped term wins
    assert m["clip_frac"] == pytest.approx(1 / 5)
    assert m["approx_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 5, abs=1e-6)


def test_ppo_dual_clip_caps_negative_advantage() -> None:
    lp = torch.tensor([[math.log(5.0)]])
    loss, m = policy_loss_with_metrics("ppo", lp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert float(loss) == pytest.approx(3.0)  # min(−A·c, max(−A·r, −A·clip(r))) = min(3, 5)
    assert m["clip_frac_lower"] == pytest.approx(1.0)


def test_importance_sampling_is_unclipped() -> None:
    adv = torch.tensor([1.0, -1.0])
    loss = policy_loss("importance_sampling", LP, OLD, adv, MASK)
    assert float(loss) == pytest.approx((-1 - 1.5 - 0.5 + 1.1 + 1.0) / 5, abs=1e-6)


def test_gspo_sequence_ratio() -> None:
    adv = torch.tensor([1.0, 1.0])
    loss, m = policy_loss_with_metrics("gspo", LP, OLD, adv, MASK, agg="seq-mean-token-mean")
    s0 = math.exp((math.log(1.5) + math.log(0.5)) / 3)  # 0.9086: inside [0.8, 1.2]
    s1 = math.exp(math.log(1.1) / 2)  # 1.0488
    assert float(loss) == pytest.approx((-s0 - s1) / 2, abs=1e-6)
    assert m["clip_frac"] == 0.0
    # the gradient flows per token through logπ with the sequence ratio as weight
    lp = LP.clone().requires_grad_(True)
    policy_loss("gspo", lp, OLD, adv, MASK, agg="seq-mean-token-mean").backward()
    assert lp.grad[0, 0].item() == pytest.approx(-s0 / 3 / 2, abs=1e-6)
    assert lp.grad[1, 2].item() == 0.0


def test_first_ratio_is_one_gives_minus_mean_advantage() -> None:
    lp = torch.randn(3, 4)
    adv = torch.tensor([0.5, -1.0, 2.0])
    loss = policy_loss("ppo", lp, lp.clone(), adv, torch.ones(3, 4))
    assert float(loss) == pytest.approx(-float(adv.mean()), abs=1e-6)


X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]])
M = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 21 / 6),
        ("seq-mean-token-sum", (10 + 11) / 2),
        ("seq-mean-token-mean", (2.5 + 5.5) / 2),
        ("seq-mean-token-sum-norm", 21 / (2 * 4)),
    ],
)
def test_aggregation_modes(mode: str, expected: float) -> None:
    assert float(agg_loss(X, M, mode)) == pytest.approx(expected)


def test_aggregation_with_global_denominators_sums_over_microbatches() -> None:
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        full = agg_loss(X, M, mode)
        parts = sum(
            agg_loss(X[i : i + 1], M[i : i + 1], mode, token_denominator=6.0, seq_denominator=2.0, norm_tokens=4)
            for i in range(2)
        )
        assert float(parts) == pytest.approx(float(full)), mode
    with pytest.raises(ConfigError, match="unknown loss aggregation"):
        agg_loss(X, M, "mean")


def test_kl_penalties() -> None:
    lp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    assert float(kl_penalty(lp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(kl_penalty(lp, ref, "k3")) == pytest.approx(0.5 - math.log(0.5) - 1)
    loss, m = policy_loss_with_metrics("ppo", lp, lp, torch.tensor([0.0]), torch.ones(1, 1),
                                       ref_logprobs=ref, kl_coef=0.1, kl_type="k1")
    assert float(loss) == pytest.approx(0.1 * math.log(2)) and m["kl"] == pytest.approx(math.log(2))


def test_loss_name_and_clip_c_validation() -> None:
    with pytest.raises(ConfigError, match="unknown policy loss"):
        policy_loss("a2c", LP, OLD, torch.ones(2), MASK)
    with pytest.raises(ConfigError, match="clip_c"):
        policy_loss("ppo", LP, OLD, torch.ones(2), MASK, clip_c=1.0)


def test_k3_kl_gradients_stay_finite_for_huge_ratios_even_where_masked() -> None:
    """A log-ratio of ±80 (a token the reference finds impossible) must not turn the gradient into NaN."""
    import torch

    from rllm_train.algorithms import kl_penalty, policy_loss_with_metrics

    logp = torch.tensor([[-0.5, -90.0, -0.2]], requires_grad=True)
    ref = torch.tensor([[-0.4, -0.1, -85.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    kl = kl_penalty(logp, ref, "k3")
    assert torch.isfinite(kl).all() and float(kl.max()) <= 10.0
    loss, _ = policy_loss_with_metrics("ppo", logp, logp.detach(), torch.tensor([1.0]), mask, ref_logprobs=ref,
                                       kl_coef=0.1, kl_type="k3")
    loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()
