"""verl's own actor worker (TrainingWorker + FSDP2 engine + ppo_loss) runs one update of a tiny random Llama on a
CPU (gloo, world size 1), and its loss / grad norm / updated weights match the same step done directly in torch
with rllm's policy_loss_with_metrics (ppo, token-mean) on the same weights and batch."""

from __future__ import annotations

import copy
import os

import pytest

verl = pytest.importorskip("verl")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

CLIP_LOW, CLIP_HIGH, CLIP_C, LR = 0.2, 0.28, 3.0, 1e-2
OVERRIDES = {
    "clip_ratio_low": CLIP_LOW, "clip_ratio_high": CLIP_HIGH, "clip_ratio_c": CLIP_C,
    "loss_agg_mode": "token-mean", "policy_loss.loss_mode": "vanilla", "use_kl_loss": False,
    "ppo_micro_batch_size_per_gpu": 2, "optim.lr": LR, "optim.weight_decay": 0.0, "optim.clip_grad": 1.0,
    "optim.optimizer": "SGD",  # weight change = -lr * clipped grad: the weights then compare the gradients
    "model.enable_gradient_checkpointing": False,
}
PROMPT_LENS, RESPONSE_LENS = [4, 3, 2, 4], [5, 3, 4, 1]
ADVANTAGES = [1.0, -1.0, 0.5, -2.0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4)
    path = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def worker(model_dir: str):
    from rllm_backends.verl.worker import VerlActorWorker

    saved = {k: os.environ.get(k) for k in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES", "RANK", "LOCAL_RANK",
                                            "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    w = VerlActorWorker(model_dir, OVERRIDES, device="cpu")
    yield w
    w.close()
    for key, value in saved.items():  # install() exports the platform for child processes: undo it
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _batch() -> tuple[verl.DataProto, list[list[int]], list[int]]:
    """A hand-built batch in verl's layout (left-padded prompts, right-padded responses, pad 0)."""
    from verl import DataProto

    g = torch.Generator().manual_seed(1)
    B, P, R = len(PROMPT_LENS), max(PROMPT_LENS), max(RESPONSE_LENS)
    prompts, responses = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    attention = torch.zeros(B, P + R, dtype=torch.long)
    seqs = []
    for i, (k, n) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        p, r = torch.randint(1, 256, (k,), generator=g), torch.randint(1, 256, (n,), generator=g)
        prompts[i, P - k:], responses[i, :n] = p, r
        attention[i, P - k:P + n] = 1
        seqs.append(p.tolist() + r.tolist())
    response_mask = attention[:, P:].clone()
    tensors = {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention, "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "advantages": torch.tensor(ADVANTAGES).unsqueeze(1) * response_mask,
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}), seqs, PROMPT_LENS


def _reference_logprobs(model, seqs: list[list[int]], prompt_lens: list[int], R: int) -> torch.Tensor:
    from rllm_backends.local_torch.logprobs import collate, sequence_logprobs

    ids = collate(seqs, 0, torch.long, "cpu")
    mask = collate([[1] * len(s) for s in seqs], 0, torch.long, "cpu")
    lp, _ = sequence_logprobs(model, ids, mask)  # token j's log-prob at index j-1
    out = torch.zeros(len(seqs), R)
    for i, (s, k) in enumerate(zip(seqs, prompt_lens, strict=True)):
        n = len(s) - k
        out[i, :n] = lp[i, k - 1:k - 1 + n]
    return out


def test_cpu_platform_is_verls_platform(worker) -> None:
    from verl.plugin.platform import get_platform
    from verl.utils.device import get_device_name, get_nccl_backend
    from verl.workers.engine import EngineRegistry

    from rllm_backends.verl.cpu_platform import PlatformCPU

    assert isinstance(get_platform(), PlatformCPU)
    assert (get_device_name(), get_nccl_backend()) == ("cpu", "gloo")
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is type(worker.worker.engine)
    assert torch.distributed.get_backend() == "gloo" and torch.distributed.get_world_size() == 1


_STOCK_VERL = """
import torch
from verl.plugin.platform import get_platform
print("fallback", get_platform().device_name, torch.cuda.is_available())
import rllm_backends.verl.cpu_platform as cp  # registers the platform class only; install() not called
import verl.plugin.platform.platform_manager as pm
from verl.plugin.platform import set_platform
set_platform(cp.PlatformCPU())
from verl.utils.distributed import initialize_global_process_group_ray
try:
    initialize_global_process_group_ray()
except ValueError as e:
    print("pg", str(e).split(":")[0].split(" in backend")[0].strip())
from verl.workers.engine import EngineRegistry
try:
    EngineRegistry.get_engine_cls("language_model", "fsdp2")
except ValueError as e:
    print("engine", e)
import transformers
from verl.models.transformers.monkey_patch import apply_monkey_patch
tiny = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8,
    num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1))
try:
    apply_monkey_patch(model=tiny)
    print("trl ok")
except ImportError as e:
    print("trl", e)
"""


def test_stock_verl_stops_where_the_docstring_says() -> None:
    """Without install(), in a fresh process: the nvidia fallback, the gloo backend string torch refuses, no
    engine for device 'cpu', and (with trl >= 1) the trl import (rllm_backends/verl/worker.py docstring)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", _STOCK_VERL], env=env, capture_output=True, text=True,
                         timeout=300).stdout
    if "fallback cuda False" not in out:
        pytest.skip(f"this machine has an accelerator verl detects: {out!r}")
    assert "pg Duplicate device type cpu" in out, out
    assert "engine No engine registered for device='cpu'" in out, out
    import importlib.util

    if importlib.util.find_spec("trl") is not None:  # verl 0.9.1 vs trl >= 1 (rllm's dependency), any device
        assert "trl cannot import name 'AutoModelForCausalLMWithValueHead'" in out or "trl ok" in out, out


def test_fsdp1_strategy_cannot_wrap_a_cpu_module(worker, model_dir: str) -> None:
    from rllm_backends.verl.worker import VerlActorWorker

    with pytest.raises(ValueError, match="CPU parameters or buffers when `sync_module_states=True`"):
        VerlActorWorker(model_dir, {**OVERRIDES, "strategy": "fsdp"}, device="cpu")


def test_one_verl_update_matches_torch_and_rllm_loss(worker, model_dir: str) -> None:
    from rllm_train.algorithms import policy_loss_with_metrics

    data, seqs, prompt_lens = _batch()
    R = data.batch["responses"].shape[1]
    mask = data.batch["response_mask"].float()
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa",
                                                            torch_dtype=torch.float32)
    initial = worker.state_dict()
    ref.load_state_dict(initial)  # the exact weights verl's engine holds
    ref_before = copy.deepcopy(ref)

    # verl's compute_log_prob equals the direct forward on the unpadded rows
    verl_lp = worker.compute_log_prob(data).batch["old_log_probs"]
    with torch.no_grad():
        ref_lp = _reference_logprobs(ref, seqs, prompt_lens, R)
    assert (verl_lp * mask - ref_lp * mask).abs().max() < 1e-5

    # off-policy old log-probs so the clip and dual-clip branches are exercised
    g = torch.Generator().manual_seed(2)
    old = (ref_lp + 0.3 * torch.randn(ref_lp.shape, generator=g)) * mask
    data.batch["old_log_probs"] = old
    data.batch["rollout_log_probs"] = old.clone()

    # the same step in torch: rllm's loss, backward, clip, SGD (verl's optimizer settings)
    ref.train()
    ref.zero_grad()
    loss, rllm_metrics = policy_loss_with_metrics(
        "ppo", _reference_logprobs(ref, seqs, prompt_lens, R), old, data.batch["advantages"], mask,
        agg="token-mean", clip_low=CLIP_LOW, clip_high=CLIP_HIGH, clip_c=CLIP_C)
    loss.backward()
    ref_grad_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=1.0))
    torch.optim.SGD(ref.parameters(), lr=LR, weight_decay=0.0).step()

    metrics = worker.update(data)
    loss = loss.item()
    print(f"\nverl metrics: {metrics}\nrllm metrics: {rllm_metrics}\ntorch loss {loss:.8f} "
          f"grad_norm {ref_grad_norm:.8f}; |d loss| {abs(metrics['loss'] - loss):.2e} "
          f"|d grad_norm| {abs(metrics['grad_norm'] - ref_grad_norm):.2e}")

    assert metrics["actor/pg_loss"] == pytest.approx(loss, abs=1e-5)
    assert metrics["loss"] == pytest.approx(loss, abs=1e-5)
    assert metrics["grad_norm"] == pytest.approx(ref_grad_norm, rel=1e-4)
    # verl averages its per-micro-batch token means of the clip fractions and KL (Metric MEAN aggregation),
    # rllm takes one token mean over the batch: equal only per micro-batch, so compare it that way
    mb = OVERRIDES["ppo_micro_batch_size_per_gpu"]
    with torch.no_grad():
        per_mb = [policy_loss_with_metrics(
            "ppo", _reference_logprobs(ref_before, seqs[j:j + mb], prompt_lens[j:j + mb], R), old[j:j + mb],
            data.batch["advantages"][j:j + mb], mask[j:j + mb], agg="token-mean", clip_low=CLIP_LOW,
            clip_high=CLIP_HIGH, clip_c=CLIP_C)[1] for j in range(0, len(seqs), mb)]
    for verl_key, rllm_key in (("actor/pg_clipfrac", "clip_frac"), ("actor/pg_clipfrac_lower", "clip_frac_lower"),
                               ("actor/ppo_kl", "approx_kl")):
        mean_of_mb = sum(m[rllm_key] for m in per_mb) / len(per_mb)
        print(f"{verl_key}: verl {metrics[verl_key]:.6f}  rllm batch {rllm_metrics[rllm_key]:.6f}  "
              f"rllm mean of micro-batches {mean_of_mb:.6f}")
        assert metrics[verl_key] == pytest.approx(mean_of_mb, abs=1e-5)
    assert metrics["lr"] == pytest.approx(LR)
    assert metrics["update_seconds"] < 60

    after = worker.state_dict()
    ref_after = ref.state_dict()
    worst = max((after[k] - ref_after[k]).abs().max().item() for k in after)
    moved = max((after[k] - initial[k]).abs().max().item() for k in after)
    print(f"max |verl weight - torch weight| after the step {worst:.2e}; max weight change {moved:.2e}")
    assert moved > 1e-4 and worst < 1e-4 * moved  # the same clipped gradient, to 1e-4 of the step


def test_verl_update_matches_the_local_backend_on_the_same_rows(worker, model_dir: str) -> None:
    """rllm rows → rows_to_dataproto → verl update, with verl_actor_overrides(config), against the local
    backend's TorchTrainer.train_step on the same rows, config and starting weights (AdamW, token-mean)."""
    batch_mod = pytest.importorskip("rllm_backends.verl.batch")
    loss_options = pytest.importorskip("rllm_backends.verl.loss_options")
    from rllm_backends.local_torch.trainer import TorchTrainer
    from rllm_backends.verl.worker import VerlActorWorker
    from rllm_train.config import TrainConfig
    from rllm_train.packing import TrainRow

    cfg = TrainConfig(lr=LR, micro_batch_size=2, batch_size=2, group_size=2, clip_high=CLIP_HIGH, device="cpu")
    verl_worker = VerlActorWorker(model_dir, loss_options.verl_actor_overrides(cfg), device="cpu")
    start = verl_worker.state_dict()
    local_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    local_model.load_state_dict(start)
    local = TorchTrainer(local_model, cfg, pad_token_id=0)

    g = torch.Generator().manual_seed(3)
    rows = []
    for i, (k, n) in enumerate(((3, 4), (2, 5), (4, 2), (1, 6))):
        tokens = torch.randint(1, 256, (k + n,), generator=g).tolist()
        mask = [0] * k + [1] * n
        if n >= 5:
            mask[k + 2] = 0  # an observation token inside the response: attended to, not trained
        lp = [float(x) * m for x, m in zip(-5.5 + 0.3 * torch.randn(k + n, generator=g), mask, strict=True)]
        rows.append(TrainRow(tokens=tokens, loss_mask=mask, sampling_logprobs=lp, temperature=1.0,
                             advantages=[ADVANTAGES[i] * m for m in mask], group_id=str(i // 2)))
    data = batch_mod.rows_to_dataproto(rows, pad_token_id=0)
    verl_metrics = verl_worker.update(data)
    local_metrics = local.train_step(rows)
    print(f"\nlocal: {local_metrics}\nverl:  {verl_metrics}")

    assert verl_metrics["loss"] == pytest.approx(local_metrics["train/loss"], abs=1e-5)
    # kl_coef 0, no entropy bonus: the loss is the pg loss. (The local trainer's train/pg_loss metric is not
    # comparable: it token-weights micro-batch losses that are already normalised by the whole batch.)
    assert verl_metrics["actor/pg_loss"] == pytest.approx(local_metrics["train/loss"], abs=1e-5)
    assert verl_metrics["grad_norm"] == pytest.approx(local_metrics["train/grad_norm"], rel=1e-4)
    after, local_after = verl_worker.state_dict(), local.model.state_dict()
    worst = max((after[k] - local_after[k]).abs().max().item() for k in after)
    moved = max((after[k] - start[k]).abs().max().item() for k in after)
    diffs = torch.cat([(after[k] - local_after[k]).abs().flatten() for k in after])
    print(f"max |verl - local| weight after one AdamW step {worst:.2e} (max change {moved:.2e}); "
          f"weights off by > 1e-6: {(diffs > 1e-6).float().mean().item():.2e} of {diffs.numel()}")
    # AdamW's first step is lr·g/(|g|+eps) per weight: tiny gradients amplify float noise, so compare to lr
    assert moved > 0.5 * LR and worst < 1e-2 * LR


def test_save_load_roundtrip(worker, tmp_path) -> None:
    before = worker.state_dict()
    worker.save(tmp_path / "ckpt", global_step=1)
    data, _, _ = _batch()
    data.batch["old_log_probs"] = worker.compute_log_prob(data, with_entropy=False).batch["old_log_probs"]
    worker.update(data)
    assert any((worker.state_dict()[k] - v).abs().max() > 0 for k, v in before.items())
    worker.load(tmp_path / "ckpt")
    assert all(torch.equal(worker.state_dict()[k], v) for k, v in before.items())


def test_update_inside_a_ray_actor(model_dir: str) -> None:
    """The same worker inside a Ray actor (num_cpus=1): verl's platform, engine and gloo group in the actor."""
    pytest.importorskip("ray")
    import ray

    from rllm_backends.verl.worker import remote_actor_worker
    from rllm_rollout.distributed.ray_cluster import connect_ray

    data, _, _ = _batch()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with connect_ray(None, num_cpus=2):
        actor = remote_actor_worker(model_dir, OVERRIDES)
        old = ray.get(actor.compute_log_prob.remote(data, with_entropy=False)).batch["old_log_probs"]
        data.batch["old_log_probs"] = old
        metrics = ray.get(actor.update.remote(data))
        where = ray.get(actor.__ray_call__.remote(lambda self: (
            type(self.worker.engine).__name__, torch.distributed.get_backend(), self.device)))
    assert where == ("FSDPEngineWithLMHead", "gloo", "cpu")
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)  # old log-probs are the actor's own
    assert metrics["grad_norm"] > 0 and metrics["lr"] == pytest.approx(LR)
