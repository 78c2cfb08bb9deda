"""A verl run's checkpoint as a Hugging Face model directory, through verl's own model merger.

A verl checkpoint (`checkpoints/step_N/verl_actor/`) is verl's FSDP state: one shard per rank plus the HF config
and tokenizer under `huggingface/`. verl ships the tool that turns it into a model directory
(`verl.model_merger`, FSDP backend): `rllm export` calls it rather than re-implementing the shard layout,
which is verl's to change between versions. The merger runs on the CPU.
"""

from __future__ import annotations

from pathlib import Path

from rllm_core.errors import ConfigError
from rllm_train.backend import ExportRequest, ExportResult
from rllm_train.export import prepare_output

__all__ = ["export_verl", "is_verl_checkpoint", "merge_verl_checkpoint"]

ACTOR_DIR = "verl_actor"


def is_verl_checkpoint(ckpt: Path) -> bool:
    return (Path(ckpt) / ACTOR_DIR).is_dir()


def merge_verl_checkpoint(ckpt: Path, out: Path) -> list[Path]:
    """Merge `ckpt`'s FSDP shards into a model directory at `out` (safetensors, config, tokenizer)."""
    try:
        from verl.model_merger.base_model_merger import ModelMergerConfig
        from verl.model_merger.fsdp_model_merger import FSDPModelMerger
    except ImportError as exc:
        raise ConfigError(f"exporting a verl checkpoint needs verl's model merger ({exc}); install "
                          "rllm[verl] (or verl --no-deps with rllm[verl-cpu])") from None
    actor = Path(ckpt) / ACTOR_DIR
    hf_config = actor / "huggingface"
    if not hf_config.is_dir():
        raise ConfigError(f"{actor} has no huggingface/ folder (verl writes the model config there): is it a "
                          "complete verl checkpoint?")
    config = ModelMergerConfig(operation="merge", backend="fsdp", local_dir=str(actor), target_dir=str(out),
                               hf_model_config_path=str(hf_config), use_cpu_initialization=True)
    merger = FSDPModelMerger(config)
    try:
        merger.merge_and_save()
    finally:
        merger.cleanup()
    return sorted(p for p in Path(out).iterdir() if p.is_file())


def export_verl(ckpt: Path, request: ExportRequest) -> ExportResult:
    """`rllm export` of a verl checkpoint: verl's FSDP shards, merged by verl's own merger into a model folder."""
    if not request.as_is:
        raise ConfigError(f"{ckpt} is a verl checkpoint: export it as is (--format hf), then convert that folder")
    out = prepare_output(request)
    return ExportResult(ckpt, out, merge_verl_checkpoint(ckpt, out), "verl FSDP checkpoint, merged")
