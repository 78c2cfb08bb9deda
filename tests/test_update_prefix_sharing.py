"""Packed rows that share a prompt carry it once (packed_rows.py): a GRPO group's samples and an agent's turns
start with the same untrained tokens. The numbers must be those of every row packed whole, or alone: logprobs,
entropy, loss and gradients within 1e-5. tiny-random model: seconds."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from rllm_backends.local_torch.logprobs import enable_packed_attention, packed_logprobs
from rllm_backends.local_torch.packed_rows import MIN_SHARED_PREFIX, PrefixGroup, pack_rows
from rllm_backends.local_torch.trainer import TorchTrainer, token_budget_batches
from rllm_serve import load_model
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

TOL = 1e-5


@pytest.fixture(scope="module")
def base_model() -> torch.nn.Module:
    return load_model("tiny-random").model.float()


def _grpo_rows(prompts: int = 3, samples: int = 4, seed: int = 0, prompt_len: int = 24) -> list[TrainRow]:
    """`samples` completions per prompt; some completions have a second turn after an observation."""
    rng = random.Random(seed)
    rows = []
    for p in range(prompts):
        prompt = [rng.randrange(5, 3000) for _ in range(prompt_len + p)]
        for s in range(samples):
            tokens, mask = list(prompt), [0] * len(prompt)
            for turn in range(2 if s % 2 else 1):
                if turn:
                    obs = rng.randint(1, 4)
                    tokens += [rng.randrange(5, 3000) for _ in range(obs)]
                    mask += [0] * obs
                gen = rng.randint(1, 10)
                tokens += [rng.randrange(5, 3000) for _ in range(gen)]
                mask += [1] * gen
            adv = rng.uniform(-1.5, 1.5)
            rows.append(TrainRow(tokens=tokens, loss_mask=mask,
                                 sampling_logprobs=[rng.uniform(-9.0, -6.0) * m for m in mask],
                                 advantages=[adv * m for m in mask], group_id=str(p)))
    return rows


def _alone(model: torch.nn.Module, row: TrainRow, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(model(input_ids=torch.tensor([row.tokens])).logits[0, :-1].float() / temperature, -1)
    cols = torch.tensor([j for j in range(1, len(row.tokens)) if row.loss_mask[j]])
    want = logp[cols - 1, torch.tensor(row.tokens)[cols]]
    return want, -(logp.exp() * logp).sum(-1)[cols - 1]


def test_a_groups_prompt_is_packed_once_and_every_row_scores_as_alone(base_model: torch.nn.Module) -> None:
    model = copy.deepcopy(base_model)
    assert enable_packed_attention(model)
    rows = _grpo_rows()
    short = TrainRow(tokens=[*rows[0].tokens[:10], 7, 8, 9], loss_mask=[0] * 10 + [1, 1, 1],
                     sampling_logprobs=[0.0] * 13, advantages=[0.0] * 13)
    rows.insert(4, short)  # shares 10 < MIN_SHARED_PREFIX tokens with its neighbours: packed whole
    packed = pack_rows([r.tokens for r in rows], [r.loss_mask for r in rows], "cpu")
    assert [g.prefix for g in packed.groups] == [24, 0, 25, 26]
    assert packed.groups[1] == PrefixGroup(0, (13,))
    assert packed.input_ids_1N.shape[1] == sum(len(r.tokens) for r in rows) - 3 * 24 - 3 * 25 - 3 * 26
    logp_K, ent_K = packed_logprobs(model, packed, temperature=0.8, with_entropy=True, chunk=7)
    assert ent_K is not None
    k = 0
    for row in rows:
        want, ent = _alone(model, row, 0.8)
        assert torch.allclose(logp_K[k: k + len(want)], want, atol=TOL, rtol=0)
        assert torch.allclose(ent_K[k: k + len(want)], ent, atol=TOL, rtol=0)
        k += len(want)
    assert k == logp_K.numel()


def test_the_shared_part_stops_before_the_first_trained_token_and_at_the_common_prefix() -> None:
    a = list(range(100, 140))
    rows = [(a, [0] * 30 + [1] * 10),
            (a[:20] + [1] * 20, [0] * 35 + [1] * 5),  # common with a: 20 tokens
            (a, [0] * 18 + [1] * 22)]  # trains from token 18: only 18 can be shared
    packed = pack_rows([t for t, _ in rows], [m for _, m in rows], "cpu")
    assert packed.groups == (PrefixGroup(18, (22, 22, 22)),)
    # the first trained token of the third row is predicted from the shared prefix's last token
    first = packed.row_K.tolist().index(2)
    assert packed.col_K[first] == 18 and packed.source_K[first] == 17
    none = pack_rows([t for t, _ in rows], [m for _, m in rows], "cpu", min_shared=0)
    assert none.groups == tuple(PrefixGroup(0, (40,)) for _ in rows)
    assert torch.equal(none.source_K, none.index_K - 1)
    assert MIN_SHARED_PREFIX == 16


def _config(**kw: object) -> TrainConfig:
    base: dict[str, object] = {"benchmark": "x", "model": "tiny-random", "lr": 1e-3, "micro_batch_size": 64}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _grads(trainer: TorchTrainer, rows: list[TrainRow]) -> tuple[float, dict[str, torch.Tensor]]:
    rows = sorted(rows, key=trainer._row_order)
    token_denom = float(sum(sum(r.loss_mask[1:]) for r in rows))
    trainer.model.zero_grad(set_to_none=True)
    if trainer.packed:
        chunks = token_budget_batches(rows, trainer.token_budget, trainer._micro_batch_key)
    else:
        chunks = [rows[i: i + 3] for i in range(0, len(rows), 3)]
    loss = sum(trainer._micro_step(c, token_denom, float(len(rows)))[0] for c in chunks)
    return loss, {n: p.grad.clone() for n, p in trainer.trainable.items() if p.grad is not None}


@pytest.mark.parametrize("options", [{}, {"kl_coef": 0.1, "recompute_old_logprobs": True},
                                     {"lora_rank": 4, "agg": "seq-mean-token-mean"}])
def test_a_step_with_shared_prompts_equals_the_padded_step(base_model: torch.nn.Module,
                                                           options: dict[str, object]) -> None:
    rows = _grpo_rows(seed=1)
    random.Random(0).shuffle(rows)  # the trainer puts a group's samples side by side itself
    torch.manual_seed(0)
    padded = TorchTrainer(copy.deepcopy(base_model), _config(micro_batch_size=3, **options))
    padded.packed = False
    torch.manual_seed(0)
    packed = TorchTrainer(copy.deepcopy(base_model), _config(backend_options={"micro_batch_tokens": 150}, **options))
    assert packed.packed
    ordered = sorted(rows, key=packed._row_order)
    chunk = token_budget_batches(ordered, packed.token_budget, packed._micro_batch_key)[0]
    groups = pack_rows([r.tokens for r in chunk], [r.loss_mask for r in chunk], "cpu").groups
    assert any(g.prefix >= 24 and len(g.suffixes) > 1 for g in groups)  # sharing happened
    loss_a, grads_a = _grads(padded, rows)
    loss_b, grads_b = _grads(packed, rows)
    assert abs(loss_a - loss_b) <= TOL
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        scale = max(1.0, float(grads_a[name].abs().max()))
        assert float((grads_a[name] - grads_b[name]).abs().max()) <= TOL * scale, name
