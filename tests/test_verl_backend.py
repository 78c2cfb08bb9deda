"""The verl backend on this CPU, end to end: verl's own TrainingWorker (FSDP2, gloo) in a Ray actor trains
tiny-random from rllm's rows; the same rows give the same loss and grad norm on the local torch backend;
`rllm train arithmetic --backend verl` runs 2 steps, checkpoints and resumes; the shared backend contract
passes; bad input (unsupported loss, verl version, too many GPUs) is refused by name."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")

from typer.testing import CliRunner

from rllm_core.errors import ConfigError
from rllm_testing.backend_contract import BackendContract, sample_rows
from rllm_train.backend import Backend, resolve_metrics
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for this module (each backend then only starts its actor); always stopped."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from rllm_rollout.distributed import connect_ray

    with connect_ray(None, num_cpus=2):
        yield


def _config(tmp_path: Path, **kw: object) -> TrainConfig:
    base: dict[str, object] = {"model": "tiny-random", "backend": "verl", "temperature": 1.0, "max_tokens": 6,
                               "lr": 1e-2, "max_steps": 4, "micro_batch_size": 3, "max_grad_norm": 1e6,
                               "output": str(tmp_path / "run")}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _step(backend: Backend, rows: list) -> dict[str, float]:
    return asyncio.run(resolve_metrics(backend.train_step(rows)))


def test_verl_update_equals_the_local_backend_on_the_same_rows(tmp_path: Path, ray_cluster: None) -> None:
    from rllm_backends.local_torch.backend import LocalTorchBackend
    from rllm_backends.verl.backend import VerlBackend

    config = _config(tmp_path)
    local, verl = LocalTorchBackend(), VerlBackend(config)
    try:
        local.setup(config.model_copy(update={"backend": "local"}))
        verl.setup(config)
        rows = sample_rows(local, n=5, max_tokens=config.max_tokens)  # 5 rows, micro-batches of 3: uneven
        ours, theirs = _step(local, rows), _step(verl, rows)
        assert theirs["train/loss"] == pytest.approx(ours["train/loss"], abs=1e-5), (ours, theirs)
        assert theirs["train/grad_norm"] == pytest.approx(ours["train/grad_norm"], rel=1e-4), (ours, theirs)
        assert theirs["train/grad_norm"] > 0
        version = verl.sync_weights()
        assert version == 1 and verl.policy_endpoint().policy_version == 1
        # the policy server now samples from verl's updated weights: its logprobs are the trained model's
        local.sync_weights()
        again = sample_rows(verl, n=2, max_tokens=config.max_tokens)
        assert again and all(r.num_trained_tokens for r in again)
    finally:
        local.shutdown()
        verl.shutdown()


def test_sft_on_verl_equals_the_local_backend_on_the_same_rows(tmp_path: Path, ray_cluster: None) -> None:
    """`--loss sft` runs inside verl's actor as the `rllm_sft` policy loss: the same NLL and gradient as ours."""
    from rllm_backends.local_torch.backend import LocalTorchBackend
    from rllm_backends.verl.backend import VerlBackend
    from rllm_serve.models import load_tokenizer
    from rllm_train.packing import pack_trajectory
    from rllm_train.sft_data import chat_trajectory, eos_ids

    tok = load_tokenizer("tiny-random")
    talk = [{"role": "user", "content": f"Say {w}."} for w in ("yes", "no", "maybe")]
    rows = [r.model_copy(update={"temperature": 1.0}) for m in talk for r in pack_trajectory(chat_trajectory(
        [m, {"role": "assistant", "content": m["content"].split()[1]}], tok, end_of_turn_ids=eos_ids(tok)), 1.0)[0]]
    config = _config(tmp_path, loss="sft")
    local, verl = LocalTorchBackend(), VerlBackend(config)
    try:
        local.setup(config.model_copy(update={"backend": "local"}))
        verl.setup(config)
        ours, theirs = _step(local, rows), _step(verl, rows)
        assert theirs["train/loss"] == pytest.approx(ours["train/loss"], abs=1e-5), (ours, theirs)
        assert theirs["train/grad_norm"] == pytest.approx(ours["train/grad_norm"], rel=1e-4), (ours, theirs)
    finally:
        local.shutdown()
        verl.shutdown()


def test_off_policy_correction_on_verl_equals_the_local_backends(tmp_path: Path, ray_cluster: None) -> None:
    """--rollout-is on the verl CPU path: π_prox recomputed by verl's actor, the weights handed to verl's ppo_loss
    as rollout_is_weights; the same rows (behaviour logprobs moved off the trainer's so the weights vary and some
    are truncated) give the local backend's loss, grad norm and correction metrics."""
    from rllm_backends.local_torch.backend import LocalTorchBackend
    from rllm_backends.verl.backend import VerlBackend

    config = _config(tmp_path, recompute_old_logprobs=True, rollout_is="token", rollout_is_threshold="1.5")
    local, verl = LocalTorchBackend(), VerlBackend(config)
    try:
        local.setup(config.model_copy(update={"backend": "local"}))
        verl.setup(config)
        rows = sample_rows(local, n=5, max_tokens=config.max_tokens)
        def shift(row: TrainRow) -> TrainRow:
            pairs = enumerate(zip(row.sampling_logprobs, row.loss_mask, strict=True))
            return row.model_copy(update={"sampling_logprobs": [lp + (0.6 if i % 2 else -0.6) * m
                                                                for i, (lp, m) in pairs]})

        shifted = [shift(r) for r in rows]
        ours, theirs = _step(local, shifted), _step(verl, shifted)
        assert theirs["train/loss"] == pytest.approx(ours["train/loss"], abs=1e-5), (ours, theirs)
        assert theirs["train/grad_norm"] == pytest.approx(ours["train/grad_norm"], rel=1e-4), (ours, theirs)
        assert 0 < theirs["train/rollout_corr/is_fraction_high"] < 1
        for key in ("train/rollout_corr/is_mean", "train/rollout_corr/is_fraction_high", "train/rollout_corr/kl"):
            assert theirs[key] == pytest.approx(ours[key], abs=1e-5), key
    finally:
        local.shutdown()
        verl.shutdown()


def test_rllm_train_arithmetic_with_verl_then_resume(tmp_path: Path, ray_cluster: None) -> None:
    from rllm.cli.app import build_app
    from rllm_train.rundir import RunDir

    app = build_app()
    out = tmp_path / "arith-verl"
    common = ["--model", "tiny-random", "--batch-size", "2", "--group-size", "2", "--eval-examples", "0",
              "--max-tokens", "6", "--no-progress"]
    res = CliRunner().invoke(app, ["train", "arithmetic", "--backend", "verl", "--max-steps", "2", "--output",
                                   str(out), *common])
    assert res.exit_code == 0, res.output
    records = [m for m in RunDir(out).read_metrics() if m["kind"] == "train"]
    assert [m["step"] for m in records] == [1, 2] and [m["policy_version"] for m in records] == [1, 2]
    assert all("train/loss" in m and "train/grad_norm" in m for m in records)
    assert (out / "checkpoints" / "step_2" / "verl_actor").is_dir()
    # resumed asynchronously: steps 4's episodes sample while step 3 trains in verl's actor process
    res = CliRunner().invoke(app, ["train", "--resume", str(out), "--max-steps", "4", "--max-staleness", "1",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    records = [m for m in RunDir(out).read_metrics() if m["kind"] == "train"]
    assert [m["step"] for m in records] == [1, 2, 3, 4] and records[-1]["policy_version"] == 4
    assert records[3]["async/staleness_max"] == 1 and records[3]["async/stale_dropped"] == 0
    # rllm export: verl's own model merger turns the FSDP checkpoint into a model directory transformers loads
    res = CliRunner().invoke(app, ["export", str(out), "-o", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.num_hidden_layers > 0


class TestVerlBackendContract(BackendContract):
    @pytest.fixture(autouse=True)
    def _ray(self, ray_cluster: None) -> None:
        return None

    def make_backend(self, tmp_path: Path) -> tuple[Backend, TrainConfig]:
        from rllm_backends.verl.backend import VerlBackend

        config = _config(tmp_path, lr=1e-3)
        return VerlBackend(config), config


def test_refusals_name_the_option(tmp_path: Path) -> None:
    from rllm_backends.verl.backend import VerlBackend
    from rllm_backends.verl.gpu_cluster import check_gpus
    from rllm_train.backend import check_capabilities

    with pytest.raises(ConfigError, match="loss 'importance_sampling'"):
        VerlBackend(_config(tmp_path, loss="importance_sampling"))
    with pytest.raises(ConfigError, match="lr_schedule 'linear'"):
        VerlBackend(_config(tmp_path, lr_schedule="linear"))
    backend = VerlBackend(_config(tmp_path))
    with pytest.raises(ConfigError, match="--lora-rank 8"):
        check_capabilities(_config(tmp_path, lora_rank=8), backend.capabilities(), backend.name)
    with pytest.raises(ConfigError, match=r"asks for 8 GPU.*has 0"):
        check_gpus(8, 0.0)


def test_verl_missing_or_out_of_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    from rllm_backends.verl import backend as verl_backend

    def missing(name: str) -> str:
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", missing)
    with pytest.raises(ConfigError, match=r'pip install "rllm\[verl\]"'):
        verl_backend.require_verl()
    monkeypatch.setattr(md, "version", lambda name: "0.10.0")
    with pytest.raises(ConfigError, match=r"verl 0\.10\.0 is not supported.*>=0\.9,<0\.10"):
        verl_backend.require_verl()


def test_device_follows_the_gpus_asked_for_unless_given() -> None:
    from rllm_backends.verl.backend import VerlBackend
    from rllm_train.config import load_config

    asked = load_config(None, backend="verl", model="Qwen/Qwen2.5-1.5B-Instruct", n_gpus=8)  # the issue's command
    backend = VerlBackend(asked)
    assert backend.placement == "cuda" and asked.device == "cuda" and backend.capabilities().colocated
    explicit = load_config(None, backend="verl", n_gpus=8, device="cpu")
    assert VerlBackend(explicit).placement == "cpu"
    plain = load_config(None, backend="verl", model="tiny-random")  # no GPU on this machine: the CPU path
    import torch

    assert VerlBackend(plain).placement == ("cuda" if torch.cuda.is_available() else "cpu")


def test_gpu_path_calls_match_verl_signatures() -> None:
    """The GPU path cannot run here; pin that every verl call it makes exists with the arguments it passes."""
    import inspect

    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.single_controller.ray import RayWorkerGroup, ResourcePoolManager
    from verl.trainer.ppo.utils import Role
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.llm_server import LLMServerManager

    inspect.signature(ResourcePoolManager).bind(resource_pool_spec={"global_pool": [8]},
                                                mapping={Role.ActorRollout: "global_pool"})
    inspect.signature(RayWorkerGroup).bind(resource_pool=None, ray_cls_with_init=None, device_name="cuda")
    inspect.signature(LLMServerManager).bind(config=None, worker_group=None, rollout_resource_pool=None)
    inspect.signature(CheckpointEngineManager).bind(config=None, actor_wg=None, replicas=[])
    for name in ("sleep_replicas", "update_weights"):
        assert callable(getattr(CheckpointEngineManager, name))
    inspect.signature(ActorRolloutRefWorker.save_checkpoint).bind(None, "/p", hdfs_path=None, global_step=1,
                                                                  max_ckpt_to_keep=None)
    inspect.signature(ActorRolloutRefWorker.load_checkpoint).bind(None, "/p", hdfs_path=None,
                                                                  del_local_after_load=False)
    for name in ("init_model", "update_actor"):
        assert callable(getattr(ActorRolloutRefWorker, name))


def test_gpu_batches_are_padded_to_the_data_parallel_size_with_rows_that_train_nothing() -> None:
    from rllm_backends.verl.batch import rows_to_dataproto
    from rllm_backends.verl.gpu_cluster import pad_to_multiple
    from rllm_train.packing import TrainRow

    rows = [TrainRow(tokens=[1, 2, 3, 4 + i], loss_mask=[0, 0, 1, 1], sampling_logprobs=[0, 0, -0.5, -0.6],
                     advantages=[0, 0, 1.0, 1.0], temperature=1.0) for i in range(5)]
    data = rows_to_dataproto(rows, pad_token_id=0)
    padded = pad_to_multiple(data, 4)
    assert len(padded) == 8 and float(padded.batch["response_mask"][5:].sum()) == 0.0
    assert float(padded.batch["advantages"][5:].abs().sum()) == 0.0
    assert pad_to_multiple(data, 5) is data


def test_backend_options_may_pick_the_engine_but_not_rllm_options(tmp_path: Path) -> None:
    from rllm_backends.verl.config import compose_trainer_config

    sglang = _config(tmp_path, device="cuda", backend_options={"actor_rollout_ref": {"rollout": {"name": "sglang"}}})
    assert compose_trainer_config(sglang, "/models/m", str(tmp_path)).actor_rollout_ref.rollout.name == "sglang"
    clash = _config(tmp_path, device="cuda", backend_options={"actor_rollout_ref": {"actor": {"clip_ratio_low": 0.1}}})
    with pytest.raises(ConfigError, match="clip_ratio_low, which rllm already sets"):
        compose_trainer_config(clash, "/models/m", str(tmp_path))
    unknown = _config(tmp_path, device="cuda", backend_options={"trainer": {"no_such_key": 1}})
    with pytest.raises(ConfigError, match="no_such_key"):
        compose_trainer_config(unknown, "/models/m", str(tmp_path))


def test_kl_is_refused_up_front_until_a_reference_is_computed(tmp_path: Path) -> None:
    from rllm_backends.verl.backend import VerlBackend
    from rllm_train.backend import check_capabilities

    backend = VerlBackend(_config(tmp_path))
    with pytest.raises(ConfigError, match=r"--kl-type k3.*reference log-probs"):
        check_capabilities(_config(tmp_path, kl_coef=0.1), backend.capabilities(), backend.name)

