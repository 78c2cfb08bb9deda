"""Loss equality with verl 0.9: verl's own policy losses, agg_loss and kl_penalty (and its worker's ppo_loss),
configured by our `verl_actor_overrides` through verl's real Hydra config, applied to the converted batch,
give our `policy_loss_with_metrics` on the rows: values, gradients and clip metrics; plus the option mapping's
refusals and the version pin."""

from __future__ import annotations

import functools
import os

import pytest

verl = pytest.importorskip("verl")

import torch  # noqa: E402

from rllm_backends.verl.batch import rows_to_dataproto  # noqa: E402
from rllm_backends.verl.loss_options import (  # noqa: E402
    SUPPORTED,
    as_hydra_overrides,
    check_verl_version,
    verl_actor_overrides,
)
from rllm_core.errors import ConfigError  # noqa: E402
from rllm_train.algorithms import policy_loss_with_metrics  # noqa: E402
from rllm_train.config import TrainConfig  # noqa: E402
from rllm_train.packing import TrainRow  # noqa: E402

TOL = 1e-5
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@functools.cache
def _actor_config(options: tuple[tuple[str, object], ...]):  # -> verl FSDPActorConfig
    """verl's actor config as its trainer builds it: ppo_trainer.yaml composed with our overrides."""
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    overrides = as_hydra_overrides(verl_actor_overrides(TrainConfig(**dict(options))))
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def _rows() -> list[TrainRow]:
    """Rows of different lengths, one multi-turn, advantages of both signs (one varying per token)."""
    g = torch.Generator().manual_seed(0)
    shapes = [(3, [(4, 1)], 1.0), (1, [(7, 1)], -0.7), (2, [(2, 1), (3, 0), (3, 1)], 0.4), (5, [(2, 1)], -1.3),
              (2, [(5, 1), (1, 0), (2, 1)], None), (4, [(3, 1)], 0.0)]
    rows = []
    for i, (prompt, segments, adv) in enumerate(shapes):
        mask = [0] * prompt + [m for n, m in segments for _ in range(n)]
        lps = [float(-torch.rand((), generator=g)) * 2 * m for m in mask]
        advs = [(adv if adv is not None else float(torch.randn((), generator=g))) * m for m in mask]
        old = [lp + 0.05 * float(torch.randn((), generator=g)) * m for lp, m in zip(lps, mask, strict=True)]
        rows.append(TrainRow(tokens=[10 + i] * len(mask), loss_mask=mask, sampling_logprobs=lps, advantages=advs,
                             old_logprobs=old if i % 2 else None, temperature=1.0, group_id=f"g{i // 2}",
                             trajectory_id=f"t{i}"))
    return rows


def _response_to_rows_layout(resp_BR: torch.Tensor, data, width: int) -> torch.Tensor:
    """A response-aligned [B, R] tensor placed at its rows' token positions [B, width], differentiably."""
    attn, prompt_w = data.batch["attention_mask"], data.batch["prompts"].shape[1]
    out = []
    for i in range(resp_BR.shape[0]):
        k, n = int(attn[i, :prompt_w].sum()), int(attn[i, prompt_w:].sum())
        out.append(torch.cat([resp_BR.new_zeros(k), resp_BR[i, :n], resp_BR.new_zeros(width - k - n)]))
    return torch.stack(out)


def _collate(rows: list[TrainRow], field: str) -> torch.Tensor:
    seqs = [getattr(r, field) if getattr(r, field) is not None else r.sampling_logprobs for r in rows]
    width = max(len(s) for s in seqs)
    return torch.tensor([list(s) + [0.0] * (width - len(s)) for s in seqs], dtype=torch.float32)


def _case(loss: str, agg: str, kl_type: str | None):
    """Our loss on the rows and verl's on the converted batch, for the same random current/ref logprobs."""
    options = dict(loss=loss, agg=agg, clip_low=0.2, clip_high=0.28, clip_c=3.0, max_tokens=16,
                   kl_coef=0.05 if kl_type else 0.0, kl_type=kl_type or "k3")
    actor = _actor_config(tuple(sorted(options.items())))
    rows = _rows()
    data = rows_to_dataproto(rows, pad_token_id=0)
    b = data.batch
    mask = b["response_mask"]
    g = torch.Generator().manual_seed(1)
    delta = 0.6 * torch.randn(mask.shape, generator=g) + 0.4 * torch.randn((mask.shape[0], 1), generator=g)
    delta[0, :2], delta[1, :3], delta[3, :1] = torch.tensor([-1.0, 0.5]), 1.5, 1.6  # beyond ±ε and beyond c
    cur = (b["old_log_probs"] + delta).requires_grad_(True)
    ref = b["old_log_probs"] + 0.3 * torch.randn(mask.shape, generator=g)

    width = max(len(r.tokens) for r in rows)
    ours, our_metrics = policy_loss_with_metrics(
        loss, _response_to_rows_layout(cur, data, width), _collate(rows, "old_logprobs"),
        _collate(rows, "advantages"), _collate(rows, "loss_mask"), agg, 0.2, 0.28, 3.0,
        ref_logprobs=_response_to_rows_layout(ref, data, width), kl_coef=options["kl_coef"],
        kl_type=options["kl_type"], norm_tokens=16)
    (our_grad,) = torch.autograd.grad(ours, cur)

    from verl.trainer.ppo import core_algos

    B = data.meta_info["global_batch_size"]  # what verl's worker passes to agg_loss as global_batch_size
    actor.global_batch_info.clear()
    actor.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=B,
                                   loss_scale_factor=actor.loss_scale_factor)
    policy_fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    theirs, their_metrics = policy_fn(old_log_prob=b["old_log_probs"], log_prob=cur, advantages=b["advantages"],
                                      response_mask=mask.bool(), loss_agg_mode=actor.loss_agg_mode, config=actor)
    if actor.use_kl_loss:
        kld = core_algos.kl_penalty(cur, ref, actor.kl_loss_type)
        theirs = theirs + actor.kl_loss_coef * core_algos.agg_loss(kld, mask.bool(), actor.loss_agg_mode,
                                                                  **actor.global_batch_info)
    (their_grad,) = torch.autograd.grad(theirs, cur)
    return actor, data, cur, ref, (ours, our_metrics, our_grad), (theirs, their_metrics, their_grad)


CASES = ([("ppo", agg, None) for agg in AGGS] + [("gspo", agg, None) for agg in AGGS]
         + [("ppo", "token-mean", "k1"), ("ppo", "token-mean", "k3"), ("ppo", "seq-mean-token-mean", "k3"),
            ("gspo", "seq-mean-token-sum-norm", "k1")])


@pytest.mark.parametrize(("loss", "agg", "kl_type"), CASES)
def test_verl_policy_loss_equals_ours(loss: str, agg: str, kl_type: str | None) -> None:
    actor, _, _, _, (ours, om, og), (theirs, tm, tg) = _case(loss, agg, kl_type)
    assert actor.policy_loss.loss_mode == {"ppo": "vanilla", "gspo": "gspo"}[loss] and actor.loss_agg_mode == agg
    assert actor.use_kl_loss == (kl_type is not None)
    diff = abs(float(ours.detach()) - float(theirs.detach()))
    assert diff <= TOL, f"{loss}/{agg}/kl={kl_type}: ours {float(ours):.7f} vs verl {float(theirs):.7f} ({diff:.2e})"
    gdiff = float((og - tg).abs().max())
    assert gdiff <= TOL, f"{loss}/{agg}/kl={kl_type}: gradients differ by {gdiff:.2e}"
    assert tm["actor/pg_clipfrac"] > 0, "the case must exercise clipping"
    assert abs(om["clip_frac"] - tm["actor/pg_clipfrac"]) <= TOL, "clip fraction"
    assert abs(om["approx_kl"] - tm["actor/ppo_kl"]) <= TOL, "approx kl"
    if loss == "ppo":
        assert tm["actor/pg_clipfrac_lower"] > 0, "the case must exercise the dual clip (A < 0, ratio > c)"
        assert abs(om["clip_frac_lower"] - tm["actor/pg_clipfrac_lower"]) <= TOL, "dual-clip fraction"


@pytest.mark.parametrize(("loss", "agg", "kl_type"), [("ppo", "seq-mean-token-sum-norm", "k3"),
                                                      ("gspo", "token-mean", "k1")])
def test_verl_worker_ppo_loss_on_unpadded_batch_equals_ours(loss: str, agg: str, kl_type: str) -> None:
    """verl's worker loss (verl.workers.utils.losses.ppo_loss), fed the batch as its trainer feeds it: unpadded
    by left_right_2_no_padding, the model's per-position log-probs sliced back by no_padding_2_padding."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    actor, data, cur, ref, (ours, _, _), _ = _case(loss, agg, kl_type)
    td = left_right_2_no_padding(data.to_tensordict())
    td["ref_log_prob"] = ref
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(td["loss_mask"].sum()))
    attn, prompt_w = data.batch["attention_mask"], data.batch["prompts"].shape[1]
    per_position = []
    for i in range(cur.shape[0]):  # position p holds the log-prob of token p + 1
        k, n = int(attn[i, :prompt_w].sum()), int(attn[i, prompt_w:].sum())
        per_position.append(torch.cat([cur.new_zeros(k - 1), cur[i, :n], cur.new_zeros(1)]))
    nested = torch.nested.as_nested_tensor(per_position, layout=torch.jagged)
    theirs, metrics = ppo_loss(actor, {"log_probs": nested}, td)
    diff = abs(float(ours.detach()) - float(theirs.detach()))
    assert diff <= TOL, f"worker ppo_loss {float(theirs):.7f} vs ours {float(ours):.7f} ({diff:.2e})"
    assert "kl_loss" in metrics, "the KL term ran"


def test_overrides_map_our_options() -> None:
    out = verl_actor_overrides(TrainConfig(loss="gspo", agg="seq-mean-token-sum-norm", clip_low=0.1, clip_high=0.3,
                                           clip_c=4.0, kl_coef=0.02, kl_type="k1", micro_batch_size=2, lr=3e-6,
                                           weight_decay=0.1, max_grad_norm=0.5, max_tokens=128, bf16=True))
    a = "actor_rollout_ref.actor."
    assert out[a + "policy_loss.loss_mode"] == "gspo"
    assert (out[a + "clip_ratio_low"], out[a + "clip_ratio_high"], out[a + "clip_ratio_c"]) == (0.1, 0.3, 4.0)
    assert out[a + "loss_agg_mode"] == "seq-mean-token-sum-norm" and out[a + "loss_scale_factor"] == 128
    assert (out[a + "use_kl_loss"], out[a + "kl_loss_coef"], out[a + "kl_loss_type"]) == (True, 0.02, "kl")
    assert out[a + "ppo_micro_batch_size_per_gpu"] == 2 and out[a + "entropy_coeff"] == 0.0
    assert (out[a + "optim.lr"], out[a + "optim.weight_decay"], out[a + "optim.clip_grad"]) == (3e-6, 0.1, 0.5)
    assert out[a + "fsdp_config.mixed_precision"]["param_dtype"] == "bf16"
    assert all(k.count(".") >= 1 for k in out), "dotted keys from the root of verl's config"
    default = verl_actor_overrides(TrainConfig())
    assert default[a + "use_kl_loss"] is False and default[a + "kl_loss_type"] == "low_var_kl"
    assert default[a + "loss_scale_factor"] is None and default[a + "policy_loss.loss_mode"] == "vanilla"
    assert default[a + "fsdp_config.mixed_precision"]["param_dtype"] == "fp32", "rllm computes in fp32 by default"
    assert any(s.startswith("+actor_rollout_ref.actor.fsdp_config.mixed_precision={") for s in
               as_hydra_overrides(default)), "a key verl's YAML lacks is added with +"


def test_overrides_compose_into_verl_config() -> None:
    actor = _actor_config((("agg", "seq-mean-token-mean"), ("clip_high", 0.28), ("micro_batch_size", 4)))
    assert type(actor).__name__ == "FSDPActorConfig"
    assert (actor.clip_ratio_high, actor.loss_agg_mode, actor.ppo_micro_batch_size_per_gpu) == \
        (0.28, "seq-mean-token-mean", 4)
    assert actor.optim.weight_decay == 0.0 and actor.optim.clip_grad == 1.0 and actor.rollout_n == 4


@pytest.mark.parametrize(("options", "message"), [
    ({"loss": "importance_sampling"}, "loss 'importance_sampling' cannot run on the verl backend"),
    ({"lr_schedule": "linear"}, "lr_schedule 'linear' cannot run on the verl backend"),
])
def test_overrides_refuse_what_verl_cannot_do(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        verl_actor_overrides(TrainConfig(**options))


@pytest.mark.parametrize("version", ["0.9.0", "0.9", "0.9.1", "0.9.2rc1", "0.9.1.post1", verl.__version__])
def test_supported_versions(version: str) -> None:
    assert str(check_verl_version(version)).startswith("0.9")


@pytest.mark.parametrize("version", ["0.8.5", "0.10.0", "0.10.0rc1", "0.10.0.dev0", "1.0", "garbage"])
def test_unsupported_versions_name_the_range(version: str) -> None:
    with pytest.raises(ConfigError, match=SUPPORTED.replace(".", r"\.")):
        check_verl_version(version)
