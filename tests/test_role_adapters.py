"""One LoRA adapter per role (--roles) in the local torch trainer and backend: each adapter trains on its own rows
only, all in one optimizer step on a frozen base; the policy server samples each role with its adapter; checkpoints
hold every adapter as a peft adapter a user can load alone; resume; and a backend without it refuses --roles."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from rllm_backends.local_torch.backend import LocalTorchBackend
from rllm_backends.local_torch.logprobs import collate, sequence_logprobs
from rllm_backends.local_torch.trainer import TorchTrainer
from rllm_core.errors import ConfigError
from rllm_core.rewards import RewardResult
from rllm_core.types import Episode, Task
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, yesno_config
from rllm_train.backend import check_capabilities
from rllm_train.config import TrainConfig
from rllm_train.loop import train
from rllm_train.packing import TrainRow

peft = pytest.importorskip("peft")

ROLES = {"solver": "lora:solver", "judge": "lora:judge"}
VOCAB = 32


def tiny_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def role_trainer(**kw: Any) -> TorchTrainer:
    """A trainer with adapters shared/judge/solver; the same weights (base and LoRA A init) every time."""
    base: dict[str, Any] = {"roles": ROLES, "lr": 1e-2, "micro_batch_size": 2, "max_tokens": 6,
                            "recompute_old_logprobs": True}  # ratio 1: the gradient is −A ∇logp / tokens
    trainer = TorchTrainer(tiny_model(), TrainConfig(**{**base, **kw}))
    return trainer


def make_rows(role: str, n: int, seed: int) -> list[TrainRow]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        tokens = torch.randint(3, VOCAB, (4 + 6,), generator=gen).tolist()
        adv = 1.0 if i % 2 == 0 else -0.5
        rows.append(TrainRow(tokens=tokens, loss_mask=[0] * 4 + [1] * 6, sampling_logprobs=[0.0] * 10,
                             advantages=[0.0] * 4 + [adv] * 6, role=role))
    return rows


def adapter_weights(trainer: TorchTrainer, adapter: str) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items() if f".{adapter}." in k}


def base_weights(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items() if "lora_" not in k}


def moved(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    return max(float((after[k] - before[k]).abs().max()) for k in before)


def deltas(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(after[k] - before[k]).flatten() for k in sorted(before)])


def silenced(rows: list[TrainRow]) -> list[TrainRow]:
    """The same rows with advantage 0: in the batch (same loss denominators), but no gradient of their own."""
    return [r.model_copy(update={"advantages": [0.0] * len(r.tokens)}) for r in rows]


def test_each_adapter_moves_by_its_own_rows_only() -> None:
    judge, solver, other = make_rows("judge", 3, 1), make_rows("solver#1", 3, 2), make_rows("critic", 1, 3)
    mixed = role_trainer()
    assert mixed.adapters == ["shared", "judge", "solver"] and mixed.ref_model is None
    # the optimizer and the count cover every adapter's LoRA weights, whatever peft's requires_grad says now
    lora = {n for n, _ in mixed.model.named_parameters() if "lora_" in n}
    assert set(mixed.trainable) == lora and len(lora) == 3 * len({n for n in lora if ".judge." in n})
    assert sum(len(g["params"]) for g in mixed.optimizer.param_groups) == len(lora)
    assert mixed.num_trainable_params == sum(p.numel() for n, p in mixed.model.named_parameters() if n in lora)
    start = {a: adapter_weights(mixed, a) for a in mixed.adapters}
    start_base = base_weights(mixed)

    m_mixed = mixed.train_step(judge + solver + other)
    assert m_mixed["train/adapter/judge/rows"] == 3 and m_mixed["train/adapter/solver/rows"] == 3
    assert m_mixed["train/adapter/shared/rows"] == 1 and m_mixed["train/adapter/shared/trained_tokens"] == 6
    assert moved(start_base, base_weights(mixed)) == 0.0  # the base is frozen
    assert min(moved(start[a], adapter_weights(mixed, a)) for a in mixed.adapters) > 1e-3  # all three moved

    # a batch of judge rows alone changes the judge adapter only
    judge_only = role_trainer()
    m_judge = judge_only.train_step(judge)
    assert m_judge["train/adapter/solver/rows"] == 0 and m_judge["train/adapter/judge/trained_tokens"] == 18
    assert moved(start["judge"], adapter_weights(judge_only, "judge")) > 1e-3
    assert moved(start["solver"], adapter_weights(judge_only, "solver")) == 0.0
    assert moved(start["shared"], adapter_weights(judge_only, "shared")) == 0.0
    assert moved(start_base, base_weights(judge_only)) == 0.0

    # each adapter's update comes from its own rows' gradient only: silencing the other roles' rows (same
    # batch, same denominators; no clipping) leaves it exactly as it was, and the silenced adapters do not move
    unclipped = role_trainer(max_grad_norm=1e9)
    unclipped.train_step(judge + solver + other)
    for a, keep in (("judge", judge), ("solver", solver), ("shared", other)):
        alone = role_trainer(max_grad_norm=1e9)
        batch = [r if r in keep else s for r, s in zip(judge + solver + other, silenced(judge + solver + other),
                                                       strict=True)]
        alone.train_step(batch)
        for b in alone.adapters:
            if b == a:
                assert torch.allclose(deltas(start[b], adapter_weights(alone, b)),
                                      deltas(start[b], adapter_weights(unclipped, b)), atol=1e-7, rtol=0)
            else:
                assert moved(start[b], adapter_weights(alone, b)) == 0.0, (a, b)

    # the grad norm is over every adapter: each adapter's gradient is its rows' sum over the whole batch's tokens
    total = m_mixed["train/trained_tokens"]
    parts = [(18, m_judge["train/grad_norm"]), (18, role_trainer().train_step(solver)["train/grad_norm"]),
             (6, role_trainer().train_step(other)["train/grad_norm"])]
    expected = sum((n / total * g) ** 2 for n, g in parts) ** 0.5
    assert m_mixed["train/grad_norm"] == pytest.approx(expected, rel=1e-4)


def test_kl_reference_is_the_base_and_serving_sends_lora_tensors_only() -> None:
    trainer = role_trainer(kl_coef=0.1)
    assert trainer.ref_model is None  # the base, adapters off: no frozen copy
    metrics = trainer.train_step(make_rows("judge", 2, 1))
    assert metrics["train/kl"] == pytest.approx(0.0, abs=1e-6)  # the step's π is still the base before it moves
    served = trainer.serving_state_dict()
    assert served and all("lora_" in k for k in served)
    assert {k.split(".lora_")[1].split(".")[1] for k in served} == {"shared", "judge", "solver"}
    assert set(served) == {k for k in trainer.model.state_dict() if "lora_" in k}


def test_roles_are_refused_by_a_backend_without_role_adapters() -> None:
    config = TrainConfig(roles=ROLES)
    with pytest.raises(ConfigError, match=r"--roles solver=lora:solver,judge=lora:judge"):
        check_capabilities(config, RecordingBackend("http://127.0.0.1:1/v1").capabilities(), "recording")
    check_capabilities(config, LocalTorchBackend().capabilities(), "local")  # the local backend takes them


# ---------------------------------------------------------------------------------------------- end to end
class AlwaysRight(YesNoBenchmark):
    """Every answer is correct: with reinforce every trained token has advantage 1, so every adapter moves."""

    def grade(self, task: Task, response: str) -> RewardResult:
        return RewardResult.correct(extracted=response[:20])


def _role_config(tmp_path: Path, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"model": "tiny-random", "workflow": "solver-judge", "roles": ROLES, "algo": "reinforce",
                            "max_steps": 2, "save_every": 1, "keep_checkpoints": 0, "eval_examples": 0,
                            "max_tokens": 4, "batch_size": 1, "group_size": 2, "lr": 2e-2, "temperature": 1.0}
    return yesno_config(tmp_path, **{**base, **kw})


@torch.no_grad()
def _step_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    ids = collate([prompt + completion], 0, torch.long, "cpu")
    attn = torch.ones_like(ids)
    return sequence_logprobs(model, ids, attn, 1.0, start=len(prompt))[0][0].tolist()


def _fresh_adapter(path: Path) -> Any:
    from rllm_serve import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.PeftModel.from_pretrained(load_model("tiny-random").model, str(path)).eval()


def _episodes(run_dir: Path, name: str) -> list[Episode]:
    lines = (run_dir / "episodes" / f"{name}.jsonl").read_text().splitlines()
    return [Episode.model_validate_json(line) for line in lines if line.strip()]


def _check_served_by_own_adapter(run_dir: Path, episodes: str, checkpoint: Path, version: int) -> int:
    """Every step of those episodes has its own role's adapter's logprobs (as saved in `checkpoint`), not the
    other role's; returns how many steps were checked."""
    adapters = {a: _fresh_adapter(checkpoint / "adapters" / a) for a in ("judge", "solver")}
    checked = 0
    for ep in _episodes(run_dir, episodes):
        for traj in ep.trajectories:
            for step in traj.steps:
                assert step.policy_version == version and step.prompt_token_ids and step.completion_token_ids
                own, other = ("judge", "solver") if traj.name == "judge" else ("solver", "judge")
                mine = _step_logprobs(adapters[own], step.prompt_token_ids, step.completion_token_ids)
                theirs = _step_logprobs(adapters[other], step.prompt_token_ids, step.completion_token_ids)
                assert mine == pytest.approx(step.logprobs, abs=1e-4), (traj.name, own)
                assert max(abs(a - b) for a, b in zip(theirs, step.logprobs, strict=True)) > 1e-3
                checked += 1
    return checked


@pytest.mark.slow
def test_solver_judge_trains_one_adapter_per_role_end_to_end(tmp_path: Path) -> None:
    backend = LocalTorchBackend()
    result = train(_role_config(tmp_path), backend=backend, benchmark=AlwaysRight(), progress=False,
                   console=Console(quiet=True))
    assert result.steps_done == 2
    for m in result.history:
        assert {"role/solver/reward_mean", "role/judge/reward_mean"} <= set(m)
        assert m["train/adapter/solver/rows"] == 4 and m["train/adapter/judge/rows"] == 2  # 2 solvers × 2 attempts
        assert m["train/adapter/shared/rows"] == 0
    ckpts = result.run_dir / "checkpoints"
    for step in ("step_1", "step_2"):
        assert {p.name for p in (ckpts / step / "adapters").iterdir() if p.is_dir()} == {"shared", "judge", "solver"}
    # step 2 was sampled from the weights after step 1 (checkpoint step_1), each role by its own adapter
    assert _check_served_by_own_adapter(result.run_dir, "step_2", ckpts / "step_1", version=1) == 2 * 3
    # each saved adapter, loaded alone on a fresh base, is the trainer's adapter
    row = _episodes(result.run_dir, "step_2")[0].trajectories[0].steps[0]
    trained: Any = backend.trainer.model.eval()
    for adapter in ("shared", "judge", "solver"):
        trained.set_adapter(adapter)
        want = _step_logprobs(trained, row.prompt_token_ids or [], row.completion_token_ids or [])
        got = _step_logprobs(_fresh_adapter(ckpts / "step_2" / "adapters" / adapter),
                             row.prompt_token_ids or [], row.completion_token_ids or [])
        assert got == pytest.approx(want, abs=1e-5)
    # resume 2 → 3 from the checkpoint: trainer state and adapters restored, one more step trained
    resumed = LocalTorchBackend()
    result3 = train(_role_config(tmp_path, max_steps=3), backend=resumed, benchmark=AlwaysRight(), resume=True,
                    progress=False, console=Console(quiet=True))
    assert result3.steps_done == 3 and resumed.trainer.step == 3
    assert [m["step"] for m in map(json.loads, (result.run_dir / "metrics.jsonl").read_text().splitlines())
            if m["kind"] == "train"] == [1, 2, 3]
    assert result3.history[0]["policy_version"] == 3
    # step 3 was sampled from the restored adapters (checkpoint step_2, served as its version 2)
    assert _check_served_by_own_adapter(result.run_dir, "step_3", ckpts / "step_2", version=2) == 2 * 3
