"""Our loss options on Tinker, exactly: Tinker's built-in formulas (written here from its "Loss Functions" docs)
on advantage-scaled datums equal our aggregated losses (value and gradient) in every agg mode; the custom loss
equals `policy_loss_with_metrics` on the local trainer's tensors, through the SDK's own forward_backward_custom
glue and against the local trainer's real micro-step; plus `plan_loss`'s choices and refusals and the metrics."""

from __future__ import annotations

import math
import typing

import pytest
import torch
from tinker import types
from tinker.lib.public_interfaces.training_client import TrainingClient

from rllm_backends.local_torch.logprobs import collate, sequence_logprobs
from rllm_backends.tinker.datum import rows_to_datums
from rllm_backends.tinker.losses import (
    BUILTIN_LOSSES,
    agg_scales,
    builtin_metrics,
    custom_metrics,
    make_custom_loss,
    plan_loss,
)
from rllm_core.errors import ConfigError, TrainingError
from rllm_train.algorithms import agg_loss, policy_loss_with_metrics
from rllm_train.algorithms.names import LOSSES
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

TOL = 1e-6
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MAX_TOKENS = 16
VOCAB = 48


def _rows(seed: int = 0) -> list[TrainRow]:
    """Rows of different lengths: multi-turn ones (mask 0 → 1 → 0 → 1), advantages of both signs (one row's
    varying per token), recomputed old logprobs (odd seeds: on every row, as a trainer recomputes them for a
    whole batch), a trained token at position 0, a row with no trained target at all."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, [(4, 1)], 1.0), (1, [(7, 1)], -0.7), (2, [(2, 1), (3, 0), (3, 1)], 0.4), (0, [(3, 1)], -1.3),
              (2, [(5, 1), (1, 0), (2, 1)], None), (4, [(3, 1)], 0.0), (3, [(1, 0)], 0.5)]
    rows = []
    for i, (prompt, segments, adv) in enumerate(shapes):
        mask = [0] * prompt + [m for n, m in segments for _ in range(n)]
        lps = [float(-torch.rand((), generator=g)) * 2 * m for m in mask]
        advs = [(adv if adv is not None else float(torch.randn((), generator=g))) * m for m in mask]
        old = [lp + 0.05 * float(torch.randn((), generator=g)) * m for lp, m in zip(lps, mask, strict=True)]
        tokens = torch.randint(3, VOCAB, (len(mask),), generator=g).tolist()
        rows.append(TrainRow(tokens=tokens, loss_mask=mask, sampling_logprobs=lps, advantages=advs,
                             old_logprobs=old if seed % 2 else None, temperature=1.0, trajectory_id=f"t{i}"))
    return rows


def _new_logprobs(rows: list[TrainRow], seed: int, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """'Current policy' target logprobs per datum (len(tokens) − 1), moved off π_old enough to clip."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in rows:
        old = torch.tensor((r.old_logprobs or r.sampling_logprobs)[1:], dtype=torch.float64)
        noise = 0.35 * torch.randn(len(old), generator=g, dtype=torch.float64)
        out.append((old + noise).clamp(max=-1e-3).to(dtype).requires_grad_(True))
    return out


def _local(rows: list[TrainRow], new: list[torch.Tensor], ref: list[list[float]] | None = None) -> dict:
    """The tensors the local trainer builds for one micro-batch of `rows` (trainer.py::_micro_step), with the
    given target logprobs in place of its forward pass."""
    kept = [(r, n) for r, n in zip(rows, new, strict=True) if any(r.loss_mask[1:])]
    rs = [r for r, _ in kept]
    start = max(1, min(r.loss_mask.index(1) for r in rs))
    width = max(len(r.tokens) for r in rs)
    logp = torch.stack([torch.nn.functional.pad(torch.cat([n.new_zeros(1), n]), (0, width - len(n) - 1))
                        for _, n in kept])[:, start:]
    dt = logp.dtype
    old = (collate([r.old_logprobs for r in rs], 0.0, dt, "cpu") if all(r.old_logprobs is not None for r in rs)
           else collate([r.sampling_logprobs for r in rs], 0.0, dt, "cpu"))
    out = {"logp": logp, "old": old[:, start:], "mask": collate([r.loss_mask for r in rs], 0, dt, "cpu")[:, start:],
           "adv": collate([r.advantages for r in rs], 0.0, dt, "cpu")[:, start:],
           "token_denominator": float(sum(sum(r.loss_mask[1:]) for r in rs)), "seq_denominator": float(len(rs)),
           "ref": None}
    if ref is not None:
        refs = [rf for r, rf in zip(rows, ref, strict=True) if any(r.loss_mask[1:])]
        out["ref"] = collate([[0.0 if x is None else x for x in rf] for rf in refs], 0.0, dt, "cpu")[:, start:]
    return out


def _ours(name: str, t: dict, agg: str, **kw: object) -> tuple[torch.Tensor, dict[str, float]]:
    return policy_loss_with_metrics(name, t["logp"], t["old"], t["adv"], t["mask"], agg, kw.pop("clip_low", 0.2),
                                    kw.pop("clip_high", 0.28), kw.pop("clip_c", 3.0), ref_logprobs=t["ref"],
                                    token_denominator=t["token_denominator"], seq_denominator=t["seq_denominator"],
                                    norm_tokens=MAX_TOKENS, **kw)  # type: ignore[arg-type]


def _tinker_builtin(name: str, datums: list[types.Datum], new: list[torch.Tensor], lo: float, hi: float
                    ) -> torch.Tensor:
    """Tinker's server-side RL losses as its docs state them, summed over tokens and datums."""
    total = torch.zeros((), dtype=torch.float64)
    for datum, x in zip(datums, new, strict=True):
        q = datum.loss_fn_inputs["logprobs"].to_torch().double()
        a = datum.loss_fn_inputs["advantages"].to_torch().double()
        ratio = torch.exp(x - q)
        if name == "importance_sampling":
            total = total - (ratio * a).sum()
        elif name == "ppo":
            total = total - torch.min(ratio * a, torch.clamp(ratio, lo, hi) * a).sum()
        else:  # cispo
            total = total - (torch.clamp(ratio, lo, hi).detach() * a * x).sum()
    return total


def _grads(loss: torch.Tensor, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """d loss / d leaf (zeros for a leaf the loss does not use: a row without trained tokens)."""
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, retain_graph=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)]


def _f(x: torch.Tensor) -> float:
    return float(x.detach())


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = TOL) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.double(), y.double(), atol=tol, rtol=0)


# ------------------------------------------------------------------------------------ built-in losses, scaled
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_builtin_importance_sampling_on_scaled_advantages_is_our_loss(agg: str, seed: int) -> None:
    rows = _rows(seed)
    cfg = TrainConfig(loss="importance_sampling", agg=agg, max_tokens=MAX_TOKENS)
    plan = plan_loss(cfg, {})
    assert (plan.kind, plan.loss_fn, plan.loss_fn_config) == ("builtin", "importance_sampling", None)
    datums = rows_to_datums(rows, plan.scales(rows))
    new = _new_logprobs(rows, seed + 10)
    theirs = _tinker_builtin("importance_sampling", datums, new, 0, 0)
    ours, _ = _ours("importance_sampling", _local(rows, new), agg)
    assert abs(_f(theirs) - _f(ours)) < TOL
    _assert_same(_grads(theirs, new), _grads(ours, new))


@pytest.mark.parametrize("agg", AGGS)
def test_builtin_cross_entropy_on_scaled_weights_is_our_sft_loss(agg: str) -> None:
    """--loss sft runs as Tinker's cross_entropy (−Σ w·logπ as its docs state it), the advantages as weights."""
    rows = _rows(4)
    plan = plan_loss(TrainConfig(loss="sft", agg=agg, max_tokens=MAX_TOKENS), {})
    assert (plan.kind, plan.loss_fn, plan.loss_fn_config) == ("builtin", "cross_entropy", None)
    datums = rows_to_datums(rows, plan.scales(rows), plan.loss_fn)
    assert all(set(d.loss_fn_inputs) == {"target_tokens", "weights"} for d in datums)
    new = _new_logprobs(rows, 14)
    theirs = -sum((d.loss_fn_inputs["weights"].to_torch().double() * x).sum() for d, x in zip(datums, new, strict=True))
    ours, _ = _ours("sft", _local(rows, new), agg)
    assert abs(_f(theirs) - _f(ours)) < TOL
    _assert_same(_grads(theirs, new), _grads(ours, new))


@pytest.mark.parametrize("agg", AGGS)
def test_builtin_ppo_on_scaled_advantages_is_our_ppo_without_dual_clip(agg: str) -> None:
    """Tinker's ppo (loss_fn: ppo) = our ppo with the dual clip out of reach (clip_c → ∞): the scaling is exact
    for the clipped objective too, and the thresholds are 1 − clip_low, 1 + clip_high."""
    rows = _rows(2)
    plan = plan_loss(TrainConfig(agg=agg, clip_high=0.28, max_tokens=MAX_TOKENS), {"loss_fn": "ppo"})
    assert plan.loss_fn_config == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    cfg = plan.loss_fn_config or {}
    datums = rows_to_datums(rows, plan.scales(rows))
    new = _new_logprobs(rows, 3)
    theirs = _tinker_builtin("ppo", datums, new, cfg["clip_low_threshold"], cfg["clip_high_threshold"])
    ours, metrics = _ours("ppo", _local(rows, new), agg, clip_c=1e9)
    assert metrics["clip_frac"] > 0  # the clip is exercised
    assert abs(_f(theirs) - _f(ours)) < TOL
    _assert_same(_grads(theirs, new), _grads(ours, new))


@pytest.mark.parametrize("agg", AGGS)
def test_builtin_cispo_on_scaled_advantages_is_its_token_loss_under_our_agg(agg: str) -> None:
    rows = _rows(4)
    plan = plan_loss(TrainConfig(agg=agg, max_tokens=MAX_TOKENS),
                     {"loss_fn": "cispo", "loss_fn_config": {"clip_low_threshold": 0.0, "clip_high_threshold": 4}})
    assert plan.loss_fn_config == {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
    datums = rows_to_datums(rows, plan.scales(rows))
    new = _new_logprobs(rows, 5)
    theirs = _tinker_builtin("cispo", datums, new, 0.0, 4.0)
    t = _local(rows, new)
    token_loss = -(torch.clamp(torch.exp(t["logp"] - t["old"]), 0.0, 4.0).detach() * t["adv"] * t["logp"])
    ours = agg_loss(token_loss, t["mask"], agg, token_denominator=t["token_denominator"],
                    seq_denominator=t["seq_denominator"], norm_tokens=MAX_TOKENS)
    assert abs(_f(theirs) - _f(ours)) < TOL
    _assert_same(_grads(theirs, new), _grads(ours, new))


def test_agg_scales_values() -> None:
    rows = _rows(0)
    counts = [sum(r.loss_mask[1:]) for r in rows]  # row 6 has none, row 3's position-0 token does not count
    assert counts == [4, 7, 5, 2, 7, 3, 0]
    assert agg_scales(rows, "token-mean", 16) == pytest.approx([1 / 28] * 6 + [0.0])
    assert agg_scales(rows, "seq-mean-token-sum", 16) == pytest.approx([1 / 6] * 6 + [0.0])
    assert agg_scales(rows, "seq-mean-token-mean", 16) == pytest.approx([1 / (c * 6) for c in counts[:6]] + [0.0])
    assert agg_scales(rows, "seq-mean-token-sum-norm", 16) == pytest.approx([1 / 96] * 6 + [0.0])
    with pytest.raises(TrainingError, match="no trainable tokens"):
        agg_scales(rows[6:], "token-mean", 16)
    with pytest.raises(ConfigError, match="unknown loss aggregation"):
        agg_scales(rows, "sum", 16)


# ------------------------------------------------------------------------------------------- custom losses
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_custom_loss_is_our_loss_on_the_local_trainers_tensors(loss: str, agg: str, kl_coef: float) -> None:
    rows = _rows(6)
    cfg = TrainConfig(loss=loss, agg=agg, clip_high=0.28, kl_coef=kl_coef, max_tokens=MAX_TOKENS)
    plan = plan_loss(cfg, {})
    assert plan.kind == "custom" or (loss in ("importance_sampling", "sft") and kl_coef == 0)
    assert plan.needs_ref_logprobs == (kl_coef > 0)
    g = torch.Generator().manual_seed(7)
    # as SamplingClient.compute_logprobs returns them: token-aligned, None at position 0
    ref = [[None, *(torch.tensor(r.sampling_logprobs[1:]) - 0.1 * torch.rand(len(r.tokens) - 1, generator=g)
                    ).tolist()] for r in rows]
    fn = make_custom_loss(rows, cfg, ref if kl_coef else None)
    new = _new_logprobs(rows, 8)
    got, got_metrics = fn(rows_to_datums(rows), new)
    want, want_metrics = _ours(loss, _local(rows, new, ref if kl_coef else None), agg, kl_coef=kl_coef)
    assert abs(_f(got) - _f(want)) < 1e-10
    assert got_metrics == pytest.approx(want_metrics, abs=1e-10)
    assert ("kl" in got_metrics) == (kl_coef > 0)
    _assert_same(_grads(got, new), _grads(want, new), tol=1e-10)


def test_custom_loss_through_the_sdks_forward_backward_custom_glue() -> None:
    """The SDK's client-side step of forward_backward_custom (float32 logprobs from the forward pass, our loss,
    backward, weights = −grad for the server's linear backward) gives our loss and its gradient."""
    rows = _rows(9)
    cfg = TrainConfig(loss="ppo", agg="seq-mean-token-mean", max_tokens=MAX_TOKENS)
    datums = rows_to_datums(rows)
    new = _new_logprobs(rows, 10, torch.float32)
    forward = types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord",
        loss_fn_outputs=[{"logprobs": types.TensorData.from_torch(n.detach())} for n in new], metrics={})
    result = TrainingClient._compute_custom_loss(datums, make_custom_loss(rows, cfg), forward)
    want, want_metrics = _ours("ppo", _local(rows, new), "seq-mean-token-mean", clip_high=0.2)
    assert result.loss_sum == pytest.approx(_f(want), abs=1e-6)
    assert result.metrics == pytest.approx(want_metrics, abs=1e-6)
    for datum, sent, grad in zip(datums, result.data, _grads(want, new), strict=True):
        assert sent.loss_fn_inputs["target_tokens"].tolist() == datum.loss_fn_inputs["target_tokens"].tolist()
        _assert_same([sent.loss_fn_inputs["weights"].to_torch()], [-grad])


def _tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(("loss", "agg", "kl_coef"), [("ppo", "token-mean", 0.0), ("gspo", "seq-mean-token-mean", 0.0),
                                                      ("ppo", "seq-mean-token-sum-norm", 0.2)])
def test_custom_loss_gives_the_local_trainers_gradient(loss: str, agg: str, kl_coef: float) -> None:
    """Tinker's chain rule (our loss's gradient w.r.t. the logprobs, back through the model) gives the weights
    the same gradient as the local trainer's own micro-step on the whole batch."""
    from rllm_backends.local_torch.trainer import TorchTrainer

    rows = [r for r in _rows(11) if any(r.loss_mask[1:])]
    cfg = TrainConfig(loss=loss, agg=agg, kl_coef=kl_coef, max_tokens=MAX_TOKENS, micro_batch_size=64)
    trainer = TorchTrainer(_tiny_model(), cfg)
    token_denom = float(sum(sum(r.loss_mask[1:]) for r in rows))
    local_loss, local_metrics, _ = trainer._micro_step(rows, token_denom, float(len(rows)))
    local_grads = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.optimizer.zero_grad(set_to_none=True)

    ids = collate([r.tokens for r in rows], 0, torch.long, "cpu")
    attn = collate([[1] * len(r.tokens) for r in rows], 0, torch.long, "cpu")
    logp_BT, _ = sequence_logprobs(trainer.model, ids, attn, 1.0, start=1)
    per_datum = [logp_BT[i, : len(r.tokens) - 1] for i, r in enumerate(rows)]
    ref = [[None, *lp.detach().tolist()] for lp in per_datum] if kl_coef else None  # the untouched start policy
    tinker_loss, metrics = make_custom_loss(rows, cfg, ref)(rows_to_datums(rows), per_datum)
    tinker_loss.backward()
    assert _f(tinker_loss) == pytest.approx(local_loss, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(local_metrics["pg_loss"], abs=1e-6)
    for p, want in zip(trainer.model.parameters(), local_grads, strict=True):
        torch.testing.assert_close(p.grad, want, atol=1e-6, rtol=1e-4)


def test_custom_loss_recomputes_old_logprobs_like_the_local_trainer() -> None:
    rows = _rows(12)
    cfg = TrainConfig(loss="ppo", recompute_old_logprobs=True, max_tokens=MAX_TOKENS)
    new = _new_logprobs(rows, 13)
    got, metrics = make_custom_loss(rows, cfg)(rows_to_datums(rows), new)
    t = _local(rows, new)
    t["old"] = t["logp"].detach()
    want, _ = _ours("ppo", t, "token-mean", clip_high=0.2)
    assert metrics["approx_kl"] == 0 and metrics["clip_frac"] == 0
    assert abs(_f(got) - _f(want)) < 1e-10
    _assert_same(_grads(got, new), _grads(want, new), tol=1e-10)
    assert plan_loss(TrainConfig(loss="importance_sampling", recompute_old_logprobs=True), {}).needs_old_logprobs


def test_custom_loss_refuses_mismatched_inputs() -> None:
    rows = _rows(0)
    cfg = TrainConfig(max_tokens=MAX_TOKENS)
    fn = make_custom_loss(rows, cfg)
    new = _new_logprobs(rows, 1)
    with pytest.raises(TrainingError, match="got 6 datums"):
        fn(rows_to_datums(rows[:-1]), new[:-1])
    with pytest.raises(TrainingError, match=r"datum 0: .*shape \(3,\), expected \(6,\)"):
        fn(rows_to_datums(rows), [new[0][:3], *new[1:]])
    with pytest.raises(ConfigError, match=r"kl_coef 0.1 needs the reference"):
        make_custom_loss(rows, TrainConfig(kl_coef=0.1))
    with pytest.raises(TrainingError, match="reference logprobs of train row 0 have 2 entries for 7 tokens"):
        make_custom_loss(rows, TrainConfig(kl_coef=0.1), [[0.0, 0.0]] * len(rows))
    with pytest.raises(TrainingError, match="no trainable tokens"):
        make_custom_loss(rows[6:], cfg)
    short = TrainRow(tokens=[1], loss_mask=[1], sampling_logprobs=[-1.0], advantages=[1.0])
    with pytest.raises(TrainingError, match="at least 2"):
        make_custom_loss([short], cfg)


# ---------------------------------------------------------------------------------------------- plan_loss
def test_plan_defaults() -> None:
    ppo = plan_loss(TrainConfig(), {})
    assert (ppo.kind, ppo.loss_fn, ppo.needs_ref_logprobs) == ("custom", "custom", False)
    assert ppo.scales(_rows(0)) == [1.0] * 7
    assert plan_loss(TrainConfig(loss="gspo"), {}).kind == "custom"
    is_kl = plan_loss(TrainConfig(loss="importance_sampling", kl_coef=0.05), {})
    assert (is_kl.kind, is_kl.needs_ref_logprobs) == ("custom", True)
    norm_cfg = TrainConfig(loss="importance_sampling", max_tokens=100, agg="seq-mean-token-sum-norm")
    norm = plan_loss(norm_cfg, None)
    assert norm.norm_tokens == 100.0 and norm.kind == "builtin"
    assert norm.scales(_rows(0), norm_cfg) == norm.scales(_rows(0)) == pytest.approx([1 / 600] * 6 + [0.0])
    with pytest.raises(TrainingError, match="make a new plan"):
        norm.scales(_rows(0), TrainConfig(max_tokens=100))


def test_plan_refusals_name_the_option() -> None:
    with pytest.raises(ConfigError, match="not a Tinker RL loss; choose one of importance_sampling, ppo, cispo"):
        plan_loss(TrainConfig(), {"loss_fn": "grpo"})
    for name in ("dro", "gspo", "stable_reinforce", "cross_entropy", "custom"):
        with pytest.raises(ConfigError, match=f"loss_fn '{name}' is not offered"):
            plan_loss(TrainConfig(), {"loss_fn": name})
    with pytest.raises(ConfigError, match=r"kl_coef 0.1 cannot be added to Tinker's built-in ppo"):
        plan_loss(TrainConfig(kl_coef=0.1), {"loss_fn": "ppo"})
    with pytest.raises(ConfigError, match="takes no key 'beta'"):
        plan_loss(TrainConfig(), {"loss_fn": "ppo", "loss_fn_config": {"beta": 0.1}})
    with pytest.raises(ConfigError, match=r"takes no key 'clip_low_threshold' .*takes: none"):
        plan_loss(TrainConfig(), {"loss_fn": "importance_sampling", "loss_fn_config": {"clip_low_threshold": 1}})
    with pytest.raises(ConfigError, match="must be a finite number"):
        plan_loss(TrainConfig(), {"loss_fn": "cispo", "loss_fn_config": {"clip_high_threshold": "big"}})
    with pytest.raises(ConfigError, match="0 ≤ clip_low_threshold ≤ clip_high_threshold"):
        plan_loss(TrainConfig(), {"loss_fn": "cispo", "loss_fn_config": {"clip_high_threshold": 0.5}})
    with pytest.raises(ConfigError, match=r"clip_low 1.5 > 1"):
        plan_loss(TrainConfig(clip_low=1.5), {"loss_fn": "ppo"})
    with pytest.raises(ConfigError, match="loss_fn_config is only used with loss_fn"):
        plan_loss(TrainConfig(), {"loss_fn_config": {"clip_low_threshold": 0.5}})
    assert set(BUILTIN_LOSSES) <= set(typing.get_args(types.LossFnType))


# ------------------------------------------------------------------------------------------------ metrics
def test_builtin_metrics_from_the_returned_logprobs() -> None:
    rows = _rows(14)
    plan = plan_loss(TrainConfig(clip_high=0.28, max_tokens=MAX_TOKENS), {"loss_fn": "ppo"})
    new = _new_logprobs(rows, 15)
    _, want = _ours("ppo", _local(rows, new), "token-mean", clip_c=1e9)
    output = types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", metrics={"loss:sum": 0.125},
        loss_fn_outputs=[{"logprobs": types.TensorData.from_torch(n.detach())} for n in new])
    got = builtin_metrics(rows, output, plan)
    assert got["train/loss"] == got["train/pg_loss"] == 0.125
    assert got["train/approx_kl"] == pytest.approx(want["approx_kl"], abs=1e-6)
    assert got["train/clip_frac"] == pytest.approx(want["clip_frac"], abs=1e-9) and got["train/clip_frac"] > 0
    assert (got["train/rows"], got["train/trained_tokens"]) == (6.0, 28.0)
    no_outputs = types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[],
                                             metrics={"loss:sum": 1.0})
    assert "train/approx_kl" not in builtin_metrics(rows, no_outputs)


def test_custom_metrics_keep_ours_under_train_keys() -> None:
    rows = _rows(0)
    output = types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[], metrics={
        "loss:sum": 0.5, "surrogate_loss:sum": -3.0, "pg_loss": 0.5, "clip_frac": 0.25, "approx_kl": 0.01})
    got = custom_metrics(rows, output)
    assert builtin_metrics(rows, output) == got  # one call serves both paths
    assert got == {"train/loss": 0.5, "train/pg_loss": 0.5, "train/clip_frac": 0.25, "train/approx_kl": 0.01,
                   "train/rows": 6.0, "train/trained_tokens": 28.0}
    assert all(math.isfinite(v) for v in got.values())
