"""The local torch trainer on a tiny LlamaForCausalLM built here (hidden 64, 2 layers): learning, exactness
of micro-batch accumulation, resume, and the bad-input errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rllm_backends.local_torch.trainer import TorchTrainer
from rllm_core.errors import TrainingError
from rllm_train.algorithms import compute_advantages
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

VOCAB, TARGET = 32, 7


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


@torch.no_grad()
def sample(model: torch.nn.Module, prompts: list[list[int]], n_new: int, gen: torch.Generator
           ) -> tuple[list[list[int]], list[list[float]]]:
    """Plain ancestral sampling at T = 1, reporting log_softmax(logits)[token] like the policy server."""
    model.eval()
    ids = torch.tensor(prompts)
    out_lp: list[torch.Tensor] = []
    for _ in range(n_new):
        logp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), -1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)
        out_lp.append(logp.gather(-1, tok))
        ids = torch.cat([ids, tok], 1)
    comp = ids[:, len(prompts[0]):]
    return comp.tolist(), torch.cat(out_lp, 1).tolist()


def make_rows(model: torch.nn.Module, gen: torch.Generator, n_prompts: int = 4, group: int = 4, n_new: int = 6
              ) -> tuple[list[TrainRow], float]:
    prompts = [[1, 3 + i % 5, 4] for i in range(n_prompts) for _ in range(group)]
    comps, lps = sample(model, prompts, n_new, gen)
    rewards = [c.count(TARGET) / n_new for c in comps]
    gids = [str(i // group) for i in range(len(prompts))]
    adv = compute_advantages("grpo", rewards, gids).tolist()
    rows = [TrainRow(tokens=p + c, loss_mask=[0] * len(p) + [1] * len(c), sampling_logprobs=[0.0] * len(p) + lp,
                     advantages=[0.0] * len(p) + [a] * len(c), group_id=g)
            for p, c, lp, a, g in zip(prompts, comps, lps, adv, gids, strict=True)]
    return rows, sum(rewards) / len(rewards)


def cfg(**kw: object) -> TrainConfig:
    base = {"lr": 3e-3, "max_steps": 50, "micro_batch_size": 4, "max_tokens": 6, "max_grad_norm": 1.0}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_reward_for_emitting_a_token_rises() -> None:
    torch.manual_seed(0)
    trainer = TorchTrainer(tiny_model(), cfg())
    gen = torch.Generator().manual_seed(0)
    curve = []
    for step in range(14):
        rows, reward = make_rows(trainer.model, gen)
        metrics = trainer.train_step(rows)
        curve.append(reward)
        if step == 0:  # sampler and trainer agree: first ratio is 1
            assert metrics["train/approx_kl"] == pytest.approx(0.0, abs=1e-5)
            assert metrics["train/clip_frac"] == 0.0
        assert math.isfinite(metrics["train/grad_norm"]) and metrics["train/entropy"] > 0
    assert sum(curve[-4:]) / 4 > sum(curve[:4]) / 4 + 0.15, curve


def test_microbatch_accumulation_equals_full_batch() -> None:
    rows, _ = make_rows(tiny_model(), torch.Generator().manual_seed(1))
    results = []
    for mb, agg in [(16, "token-mean"), (3, "token-mean"), (16, "seq-mean-token-mean"), (5, "seq-mean-token-mean")]:
        t = TorchTrainer(tiny_model(), cfg(micro_batch_size=mb, agg=agg, max_grad_norm=1e9))
        m = t.train_step(rows)
        results.append((weights(t.model), m["train/loss"], m["train/grad_norm"]))
    for (w_a, l_a, g_a), (w_b, l_b, g_b) in [(results[0], results[1]), (results[2], results[3])]:
        assert l_a == pytest.approx(l_b, abs=1e-6) and g_a == pytest.approx(g_b, rel=1e-4)
        for k in w_a:
            torch.testing.assert_close(w_a[k], w_b[k], atol=1e-5, rtol=1e-5)  # fp32 summation order


def test_resume_gives_same_weights(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(2)
    batches = [make_rows(tiny_model(9), gen)[0] for _ in range(4)]
    straight = TorchTrainer(tiny_model(), cfg(warmup_steps=2, lr_schedule="cosine", max_steps=4))
    for b in batches:
        straight.train_step(b)
    first = TorchTrainer(tiny_model(), cfg(warmup_steps=2, lr_schedule="cosine", max_steps=4))
    for b in batches[:2]:
        first.train_step(b)
    first.save(tmp_path)
    resumed = TorchTrainer(tiny_model(5), cfg(warmup_steps=2, lr_schedule="cosine", max_steps=4))
    resumed.load(tmp_path)
    for b in batches[2:]:
        resumed.train_step(b)
    assert resumed.step == 4
    for k, v in weights(straight.model).items():
        torch.testing.assert_close(weights(resumed.model)[k], v, atol=1e-7, rtol=0)


def test_nan_loss_raises_and_leaves_weights(tmp_path: Path) -> None:
    trainer = TorchTrainer(tiny_model(), cfg())
    rows, _ = make_rows(trainer.model, torch.Generator().manual_seed(3))
    before = weights(trainer.model)
    bad = [r.model_copy(update={"advantages": [float("nan")] * len(r.tokens)}) for r in rows]
    with pytest.raises(TrainingError, match=r"not finite .* step 1"):
        trainer.train_step(bad)
    for k, v in weights(trainer.model).items():
        assert torch.equal(v, before[k])
    assert trainer.step == 0


def test_no_trainable_tokens_and_memory_check() -> None:
    trainer = TorchTrainer(tiny_model(), cfg())
    empty = TrainRow(tokens=[1, 2, 3], loss_mask=[0, 0, 0], sampling_logprobs=[0] * 3, advantages=[0] * 3)
    with pytest.raises(TrainingError, match="no trainable tokens"):
        trainer.train_step([empty])
    with pytest.raises(TrainingError, match=r"needs about [\d.]+ GiB but only [\d.]+ GiB is free.*micro-batch-size"):
        trainer.check_memory(micro_batch=100_000, seq_len=100_000)


def test_batch_that_does_not_fit_is_refused_with_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    import rllm_backends.local_torch.trainer as trainer_mod

    trainer = TorchTrainer(tiny_model(), cfg(micro_batch_size=16))
    rows, _ = make_rows(trainer.model, torch.Generator().manual_seed(6))
    before = weights(trainer.model)
    monkeypatch.setattr(trainer_mod, "_available_bytes", lambda device: 2**20)  # 1 MiB free
    with pytest.raises(TrainingError, match=r"16 rows × 9 tokens needs about [\d.]+ GiB but only 0\.0 GiB is free on "
                                            r"cpu: lower --micro-batch-size \(e\.g\. \d+\)"):
        trainer.train_step(rows)
    assert trainer.step == 0 and all(torch.equal(v, before[k]) for k, v in weights(trainer.model).items())


def test_a_token_at_position_zero_is_never_counted() -> None:
    trainer = TorchTrainer(tiny_model(), cfg())
    first_only = TrainRow(tokens=[5, 6], loss_mask=[1, 0], sampling_logprobs=[-1.0, 0.0], advantages=[1.0, 0.0])
    with pytest.raises(TrainingError, match="no trainable tokens"):  # nothing precedes token 0 to predict it
        trainer.train_step([first_only])


def test_bf16_checkpointing_and_lora_options_train() -> None:
    rows, _ = make_rows(tiny_model(), torch.Generator().manual_seed(4))
    trainer = TorchTrainer(tiny_model(), cfg(bf16=True, gradient_checkpointing=True))
    assert math.isfinite(trainer.train_step(rows)["train/loss"])
    base = tiny_model()
    names = set(base.state_dict())
    lora = TorchTrainer(base, cfg(lora_rank=4, lr=1e-2))
    before = lora.serving_state_dict()
    assert set(before) == names  # merged weights under the base model's names, ready for the server
    lora.train_step(rows)
    after = lora.serving_state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in names)
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_kl_to_the_starting_policy(lora_rank: int) -> None:
    rows, _ = make_rows(tiny_model(), torch.Generator().manual_seed(5))
    trainer = TorchTrainer(tiny_model(), cfg(kl_coef=0.5, kl_type="k3", lora_rank=lora_rank, lr=2e-2))
    first = trainer.train_step(rows)
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-6)  # still the reference policy
    second = trainer.train_step(rows)
    assert second["train/kl"] > 0


def test_each_row_is_scored_at_its_own_sampling_temperature() -> None:
    """Rows drawn at T = 0.5 and T = 1 in one batch, trainer configured at T = 1: both give ratio 1 at the first
    update (each micro-batch is scored at its rows' temperature), and old_logprobs, when given, are π_old."""
    model = tiny_model()
    rows = []
    for temp in (0.5, 1.0):
        prompts = [[1, 3, 4]] * 4
        with torch.no_grad():
            ids = torch.tensor(prompts)
            lps: list[torch.Tensor] = []
            gen = torch.Generator().manual_seed(3)
            for _ in range(5):
                logp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float() / temp, -1)
                tok = torch.multinomial(logp.exp(), 1, generator=gen)
                lps.append(logp.gather(-1, tok))
                ids = torch.cat([ids, tok], 1)
        for i, (seq, lp) in enumerate(zip(ids.tolist(), torch.cat(lps, 1).tolist(), strict=True)):
            rows.append(TrainRow(tokens=seq, loss_mask=[0] * 3 + [1] * 5, sampling_logprobs=[0.0] * 3 + lp,
                                 advantages=[0.0] * 3 + [1.0 if i % 2 else -1.0] * 5, temperature=temp))
    trainer = TorchTrainer(model, cfg(temperature=1.0, micro_batch_size=16))
    metrics = trainer.train_step(rows)
    assert metrics["train/approx_kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["train/clip_frac"] == 0.0
    shifted = [r.model_copy(update={"old_logprobs": [x - 0.5 if m else 0.0 for x, m in
                                                     zip(r.sampling_logprobs, r.loss_mask, strict=True)]})
               for r in rows]
    metrics = TorchTrainer(tiny_model(), cfg(temperature=1.0, micro_batch_size=16)).train_step(shifted)
    assert metrics["train/approx_kl"] == pytest.approx(-0.5, abs=1e-4)  # π_old is the recomputed one


def test_pg_loss_metric_adds_up_over_micro_batches() -> None:
    """train/pg_loss is the batch's policy loss whatever the micro-batch size (no KL term: it equals loss)."""
    rows, _ = make_rows(tiny_model(), torch.Generator().manual_seed(4))
    for mb in (16, 3):
        m = TorchTrainer(tiny_model(), cfg(micro_batch_size=mb)).train_step(rows)
        assert m["train/pg_loss"] == pytest.approx(m["train/loss"], abs=1e-6), (mb, m)
