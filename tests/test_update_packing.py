"""The packed update of the local torch trainer (issue 16): rows concatenated without padding (positions restarting
per row, attention split per row), log-probs through lm_head only at trained positions and in chunks, and
micro-batches by token budget. Each must give the padded path's numbers: logprobs, loss and gradients within 1e-5.
tiny-random model: seconds."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from rllm_backends.local_torch.logprobs import (
    PACKED_ATTENTION,
    chunked_token_logprobs,
    collate,
    enable_packed_attention,
    pack_rows,
    packed_logprobs,
    sequence_logprobs,
)
from rllm_backends.local_torch.trainer import TorchTrainer, micro_batch_tokens, token_budget_batches
from rllm_core.errors import ConfigError
from rllm_serve import load_model
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

TOL = 1e-5


@pytest.fixture(scope="module")
def base_model() -> torch.nn.Module:
    return load_model("tiny-random").model.float()


def _model(base: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(base)


def _rows(n: int = 7, seed: int = 0, multi_turn: bool = True) -> list[TrainRow]:
    """Rows of varied lengths; with `multi_turn` some have interior observation spans (mask 0 between turns)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = [rng.randrange(5, 3000) for _ in range(rng.randint(2, 9))]
        mask = [0] * len(prompt)
        tokens = list(prompt)
        for turn in range(rng.randint(2, 3) if multi_turn and i % 2 == 0 else 1):
            if turn:  # an observation the policy did not generate
                obs = rng.randint(1, 5)
                tokens += [rng.randrange(5, 3000) for _ in range(obs)]
                mask += [0] * obs
            gen = rng.randint(1, 12)
            tokens += [rng.randrange(5, 3000) for _ in range(gen)]
            mask += [1] * gen
        adv = rng.uniform(-1.5, 1.5)
        rows.append(TrainRow(tokens=tokens, loss_mask=mask,
                             sampling_logprobs=[rng.uniform(-9.0, -6.0) * m for m in mask],
                             advantages=[adv * m for m in mask], group_id=str(i // 2)))
    return rows


def _config(**kw: object) -> TrainConfig:
    base: dict[str, object] = {"benchmark": "x", "model": "tiny-random", "lr": 1e-3, "micro_batch_size": 64}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _grads(trainer: TorchTrainer, rows: list[TrainRow]) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one accumulation pass over `rows` (no optimizer step), as train_step computes them."""
    rows = sorted(rows, key=lambda r: len(r.tokens))
    token_denom = float(sum(sum(r.loss_mask[1:]) for r in rows))
    trainer.model.zero_grad(set_to_none=True)
    if trainer.packed:
        chunks = token_budget_batches(rows, trainer.token_budget, trainer._micro_batch_key)
    else:
        mb = trainer.config.micro_batch_size
        chunks = [rows[i : i + mb] for i in range(0, len(rows), mb)]
    loss = sum(trainer._micro_step(c, token_denom, float(len(rows)))[0] for c in chunks)
    return loss, {n: p.grad.clone() for n, p in trainer.trainable.items() if p.grad is not None}


def _assert_close_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        diff = float((a[name] - b[name]).abs().max())
        scale = max(1.0, float(b[name].abs().max()))
        assert diff <= TOL * scale, f"{name}: grads differ by {diff} (max |g| {scale})"


def test_packed_forward_equals_each_row_alone(base_model: torch.nn.Module) -> None:
    model = _model(base_model)
    assert enable_packed_attention(model) and model.config._attn_implementation == PACKED_ATTENTION
    rows = _rows()
    packed = pack_rows([r.tokens for r in rows], [r.loss_mask for r in rows], "cpu")
    logp_K, ent_K = packed_logprobs(model, packed, temperature=0.7, with_entropy=True, chunk=5)
    assert ent_K is not None
    k = 0
    for row in rows:  # reference: every row on its own, no packing, no padding
        ids = torch.tensor([row.tokens])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / 0.7, -1)
        cols = [j for j in range(1, len(row.tokens)) if row.loss_mask[j]]
        want = logp[torch.tensor(cols) - 1, torch.tensor([row.tokens[j] for j in cols])]
        ent = -(logp.exp() * logp).sum(-1)[torch.tensor(cols) - 1]
        assert torch.allclose(logp_K[k : k + len(cols)], want, atol=TOL, rtol=0)
        assert torch.allclose(ent_K[k : k + len(cols)], ent, atol=TOL, rtol=0)
        k += len(cols)
    assert k == logp_K.numel() == sum(sum(r.loss_mask[1:]) for r in rows)


def test_packed_attention_without_lengths_is_plain_sdpa(base_model: torch.nn.Module) -> None:
    """The model switched to the packed implementation still serves padded batches exactly as SDPA."""
    plain, packed = _model(base_model), _model(base_model)
    enable_packed_attention(packed)
    rows = _rows(4)
    ids = collate([r.tokens for r in rows], 0, torch.long, "cpu")
    attn = collate([[1] * len(r.tokens) for r in rows], 0, torch.long, "cpu")
    a = sequence_logprobs(plain, ids, attn)[0]
    b = sequence_logprobs(packed, ids, attn)[0]
    assert torch.equal(a * attn[:, 1:], b * attn[:, 1:])


@pytest.mark.parametrize("checkpoint", [False, True])
def test_chunked_logprobs_equal_full_ones_with_their_gradients(base_model: torch.nn.Module, checkpoint: bool
                                                               ) -> None:
    lm_head = _model(base_model).get_output_embeddings()
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, lm_head.in_features, generator=gen)
    targets = torch.randint(0, lm_head.out_features, (23,), generator=gen)
    weights = torch.randn(23, generator=gen)
    h_full = hidden.clone().requires_grad_(True)
    logp_full = torch.log_softmax(lm_head(h_full).float() / 1.3, -1)
    want = logp_full.gather(-1, targets[:, None])[:, 0]
    (want * weights).sum().backward()
    assert h_full.grad is not None and lm_head.weight.grad is not None
    full_grads = {"hidden": h_full.grad, "lm_head": lm_head.weight.grad.clone()}
    for chunk in (4, 8, 23, 100):  # CPU GEMMs take rows in blocks of 4: a 1-row chunk differs by ~1e-5 relative
        lm_head.zero_grad(set_to_none=True)
        h = hidden.clone().requires_grad_(True)
        got, ent = chunked_token_logprobs(h, lm_head, targets, 1.3, with_entropy=True, chunk=chunk,
                                          checkpoint=checkpoint)
        assert ent is not None and torch.allclose(ent, -(logp_full.exp() * logp_full).sum(-1).detach(), atol=TOL)
        assert torch.allclose(got, want.detach(), atol=TOL, rtol=0)
        (got * weights).sum().backward()
        assert h.grad is not None and lm_head.weight.grad is not None
        _assert_close_grads({"hidden": h.grad, "lm_head": lm_head.weight.grad}, full_grads)
    with pytest.raises(ValueError, match="chunk must be"):
        chunked_token_logprobs(hidden, lm_head, targets, chunk=0)


@pytest.mark.parametrize("options", [
    {},
    {"agg": "seq-mean-token-mean", "loss": "gspo"},
    {"kl_coef": 0.1, "recompute_old_logprobs": True},
    {"lora_rank": 4, "kl_coef": 0.05},
    {"gradient_checkpointing": True, "temperature": 0.6},
])
def test_packed_step_equals_padded_step(base_model: torch.nn.Module, options: dict[str, object]) -> None:
    """Same rows (multi-turn ones with interior masks among them): the same loss and gradients, packed in token
    budgets of a few rows or padded in micro-batches of 3 rows."""
    rows = _rows(9, seed=1)
    torch.manual_seed(0)  # LoRA A starts random: the same on both sides
    padded = TorchTrainer(_model(base_model), _config(micro_batch_size=3, **options))
    padded.packed = False
    torch.manual_seed(0)
    packed = TorchTrainer(_model(base_model), _config(backend_options={"micro_batch_tokens": 40}, **options))
    assert packed.packed
    loss_a, grads_a = _grads(padded, rows)
    loss_b, grads_b = _grads(packed, rows)
    assert abs(loss_a - loss_b) <= TOL
    _assert_close_grads(grads_b, grads_a)
    # and the public step: same metrics, the weights updated
    ma, mb = padded.train_step(rows), packed.train_step(rows)
    for key in ("train/loss", "train/pg_loss", "train/entropy", "train/approx_kl", "train/clip_frac"):
        assert abs(ma[key] - mb[key]) <= 1e-4 * max(1.0, abs(ma[key])), key
    assert abs(ma["train/grad_norm"] - mb["train/grad_norm"]) <= 1e-4 * max(1.0, ma["train/grad_norm"])


def test_first_step_ratio_is_one_when_old_logprobs_come_from_each_row_alone(base_model: torch.nn.Module) -> None:
    rows = _rows(6, seed=2)
    model = _model(base_model)
    for row in rows:  # the sampler's view: each row scored alone
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([row.tokens])).logits[0, :-1].float(), -1)
        lp = [0.0, *logp.gather(-1, torch.tensor(row.tokens[1:])[:, None])[:, 0].tolist()]
        row.sampling_logprobs = [v * m for v, m in zip(lp, row.loss_mask, strict=True)]
    trainer = TorchTrainer(model, _config(backend_options={"micro_batch_tokens": 50}))
    assert trainer.packed
    metrics = trainer.train_step(rows)
    assert abs(metrics["train/approx_kl"]) < 1e-5 and metrics["train/clip_frac"] == 0.0


def test_token_budget_batches_cover_every_row_once_within_budget() -> None:
    rows = _rows(25, seed=3)
    for i, row in enumerate(rows):
        row.temperature = 0.5 if i % 3 == 0 else 1.0
    key = lambda r: r.temperature  # noqa: E731
    rows.sort(key=key)
    for budget in (1, 17, 40, 10_000):
        batches = token_budget_batches(rows, budget, key)
        flat = [r for b in batches for r in b]
        assert [id(r) for r in flat] == [id(r) for r in rows]  # every row exactly once, in order
        for b in batches:
            assert len({key(r) for r in b}) == 1
            assert len(b) == 1 or sum(len(r.tokens) for r in b) <= budget
    assert len(token_budget_batches(rows, 10_000, key)) == 2  # one per temperature


def test_token_budget_option() -> None:
    assert micro_batch_tokens(_config(micro_batch_size=2, max_seq_len=64)) == 128
    assert micro_batch_tokens(_config(backend_options={"micro_batch_tokens": 300})) == 300
    for bad in (0, -5, "lots", 2.5, True):
        with pytest.raises(ConfigError, match="micro_batch_tokens must be a whole number"):
            micro_batch_tokens(_config(backend_options={"micro_batch_tokens": bad}))


def test_a_model_without_sdpa_keeps_the_padded_path(base_model: torch.nn.Module) -> None:
    model = _model(base_model)
    model.set_attn_implementation("eager")
    trainer = TorchTrainer(model, _config())
    assert not trainer.packed and model.config._attn_implementation == "eager"
    assert trainer.train_step(_rows(3))["train/rows"] == 3.0
