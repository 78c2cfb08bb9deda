"""Off-policy correction equals verl 0.9's rollout correction on shared inputs (≤ 1e-6): truncated IS (token and
sequence level), masked IS (IcePop), the weighted PPO / GSPO losses (decoupled PPO), and the mismatch metrics."""

from __future__ import annotations

import pytest

verl = pytest.importorskip("verl")

import torch  # noqa: E402

from rllm_core.errors import ConfigError  # noqa: E402
from rllm_train.algorithms import policy_loss_with_metrics  # noqa: E402
from rllm_train.algorithms.correction import correction_weights, offpolicy_metrics, parse_threshold  # noqa: E402

TOL = 1e-6


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(proximal logprobs, behaviour logprobs, mask, advantages) [6, 9]: ragged rows, ratios on both sides of
    every bound (some tokens far off: a stale sampler), one sequence whose summed log-ratio passes the ±20 bound."""
    g = torch.Generator().manual_seed(seed)
    behaviour = -2.0 * torch.rand((6, 9), generator=g, dtype=torch.float64)
    prox = behaviour + 0.5 * torch.randn((6, 9), generator=g, dtype=torch.float64)
    prox[2, :3] += torch.tensor([2.5, -3.0, 1.2], dtype=torch.float64)
    prox[5, :] += 3.0  # Σ log-ratio ≈ 27: past the safety bound
    lengths = [9, 4, 7, 1, 6, 9]
    mask = torch.tensor([[1.0] * n + [0.0] * (9 - n) for n in lengths], dtype=torch.float64)
    adv = torch.randn((6, 1), generator=g, dtype=torch.float64).expand(6, 9).clone()
    return prox, behaviour, mask, adv


LEVELS_AND_THRESHOLDS = [("token", 2.0), ("token", "5.0"), ("sequence", 2.0), ("sequence", 1e6),
                         ("token", "0.5_2.0"), ("sequence", "0.1_10.0")]


@pytest.mark.parametrize(("level", "threshold"), LEVELS_AND_THRESHOLDS)
def test_weights_and_their_metrics_equal_verls(level: str, threshold: str | float) -> None:
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    prox, behaviour, mask, _ = _batch()
    ours, om = correction_weights(prox - behaviour, mask, level, threshold)  # type: ignore[arg-type]
    theirs, tm = compute_rollout_correction_weights(prox - behaviour, mask, rollout_is=level,
                                                    rollout_is_threshold=threshold)
    assert float((ours - theirs).abs().max()) <= TOL
    for name in ("mean", "max", "min", "ratio_fraction_high", "ratio_fraction_low"):
        mine = om["is_" + name.removeprefix("ratio_")]
        assert abs(mine - tm["rollout_is_" + name]) <= TOL * max(1.0, abs(mine)), name
    if "_" in str(threshold):
        assert 0 < om["is_fraction_masked"] < 1 and abs(om["is_fraction_masked"] - tm["rollout_is_oob_ratio"]) <= TOL
    assert not ours.requires_grad and float(ours[mask == 0].abs().max()) == 0.0


def test_the_mismatch_metrics_equal_verls() -> None:
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    prox, behaviour, mask, _ = _batch(3)
    prox[5, :] -= 3.0  # keep χ²_seq finite-ish for a clean comparison
    ours = offpolicy_metrics(prox, behaviour, mask)
    theirs = compute_offpolicy_metrics(prox, behaviour, mask)
    for name, value in ours.items():
        assert abs(value - theirs[name]) <= TOL * max(1.0, abs(value)), name


@pytest.mark.parametrize("loss", ["ppo", "gspo"])
@pytest.mark.parametrize(("level", "threshold"), [("token", 2.0), ("sequence", 5.0), ("token", "0.5_2.0")])
def test_weighted_losses_equal_verls_decoupled_ppo(loss: str, level: str, threshold: str | float) -> None:
    """Decoupled PPO: the clipped ratio against π_prox (verl's old_log_prob), times the weight π_prox / μ."""
    from test_verl_losses import _actor_config
    from verl.trainer.ppo import core_algos

    prox, behaviour, mask, adv = _batch(7)
    g = torch.Generator().manual_seed(11)
    current = (prox + 0.3 * torch.randn(prox.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    weights, _ = correction_weights(prox - behaviour, mask, level, threshold)  # type: ignore[arg-type]
    ours, _ = policy_loss_with_metrics(loss, current, prox, adv, mask, "token-mean", 0.2, 0.28, 3.0,
                                       is_weights=weights)
    (our_grad,) = torch.autograd.grad(ours, current)

    actor = _actor_config((("agg", "token-mean"), ("clip_c", 3.0), ("clip_high", 0.28), ("clip_low", 0.2),
                           ("loss", loss)))
    actor.global_batch_info.clear()
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=6,
                                   loss_scale_factor=actor.loss_scale_factor)
    fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    theirs, _ = fn(old_log_prob=prox, log_prob=current, advantages=adv, response_mask=mask.bool(),
                   loss_agg_mode="token-mean", config=actor, rollout_is_weights=weights)
    (their_grad,) = torch.autograd.grad(theirs, current)
    assert abs(float(ours.detach()) - float(theirs.detach())) <= TOL
    assert float((our_grad - their_grad).abs().max()) <= TOL


def test_threshold_syntax_and_bad_values() -> None:
    assert parse_threshold(2) == (2.0, None) and parse_threshold("0.5_2") == (2.0, 0.5)
    for bad in ("two", "2_0.5", "-1", "0_2", True):
        with pytest.raises(ConfigError):
            parse_threshold(bad)  # type: ignore[arg-type]


def test_the_local_trainer_weights_its_loss_and_the_other_backends_refuse_by_name() -> None:
    from test_backend_trainer import tiny_model

    from rllm_backends.local_torch.trainer import TorchTrainer
    from rllm_train.backend import BackendCapabilities, check_capabilities
    from rllm_train.config import TrainConfig
    from rllm_train.packing import TrainRow

    with pytest.raises(ValueError, match="add --recompute-old-logprobs"):
        TrainConfig(rollout_is="token")
    with pytest.raises(ValueError, match="threshold"):
        TrainConfig(rollout_is="token", recompute_old_logprobs=True, rollout_is_threshold="2_1")
    config = TrainConfig(model="tiny-random", rollout_is="token", rollout_is_threshold="0.9_1.1",
                         recompute_old_logprobs=True, bf16=False, lr=1e-3)
    from rllm_backends.verl.backend import VerlBackend

    on_gpu = VerlBackend(config.model_copy(update={"device": "cuda"})).capabilities()  # no π_prox pass there
    assert VerlBackend(config).capabilities().rollout_is  # the CPU path hands verl its rollout_is_weights
    for backend, caps in (("verl", on_gpu), ("a backend", BackendCapabilities())):
        with pytest.raises(ConfigError, match=r"--rollout-is token \(supported: none"):
            check_capabilities(config, caps, backend)
    # a stale sampler: its logprobs far from the trainer's on half the tokens, so masked IS drops them
    rows = [TrainRow(tokens=[1, 5, 9, 13, 17, 21], loss_mask=[0, 0, 1, 1, 1, 1],
                     sampling_logprobs=[0.0, 0.0, -9.0, -0.5, -9.0, -0.5], advantages=[0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
                     temperature=1.0, group_id="g", trajectory_id="t")]
    trainer = TorchTrainer(tiny_model(), config)
    metrics = trainer.train_step(rows)
    assert 0.0 < metrics["train/rollout_corr/is_fraction_masked"] <= 1.0
    assert metrics["train/rollout_corr/k3_kl"] > 0 and "train/rollout_corr/is_mean" in metrics
    # the mismatch is logged on every step, corrected or not: here the trainer's π_prox is π, so they agree
    assert metrics["train/mismatch_kl"] == pytest.approx(metrics["train/rollout_corr/kl"], abs=1e-6)
    assert metrics["train/mismatch_k3_kl"] == pytest.approx(metrics["train/rollout_corr/k3_kl"], abs=1e-6)
