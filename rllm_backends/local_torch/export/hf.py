"""A run's checkpoint as a model directory to hand on: Hugging Face layout, optionally merged, cast or GGUF.

`export_checkpoint` backs `rllm export`: the checkpoint is resolved like `--model` does (run_model.py), loaded
with its own tokenizer and chat template, and written with transformers' `save_pretrained` (safetensors,
config, generation config) — or, for LoRA runs without `--merge-lora`, as the peft adapter folder(s) they are.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from rllm_backends.local_torch.run_model import checkpoint_info, load_checkpoint_model, resolve_checkpoint
from rllm_core.errors import ConfigError

__all__ = ["ExportResult", "export_checkpoint"]

DTYPES = ("float32", "float16", "bfloat16")
_GGUF_PRE = {"smollm2-135m": "smollm", "tiny-random": "smollm"}
"""llama.cpp's pre-tokenizer name per built-in base (both use SmolLM2's tokenizer); others: "default"."""


@dataclass
class ExportResult:
    checkpoint: Path
    out: Path
    files: list[Path]
    what: str


def export_checkpoint(spec: str, out: Path, *, step: int | None = None, merge_lora: bool = False,
                      role: str | None = None, dtype: str | None = None, fmt: str = "hf",
                      force: bool = False) -> ExportResult:
    """Write the checkpoint `spec` names (a run: its newest unless `step`; `RUN:step_N`; a checkpoint dir)."""
    ckpt = resolve_checkpoint(spec, step)
    if ckpt is None:
        raise ConfigError(f"{spec} is not a run or checkpoint of rllm train (expected a folder with checkpoints/, "
                          "or checkpoints/step_N)")
    if fmt not in ("hf", "gguf"):
        raise ConfigError(f"--format {fmt!r}: use hf or gguf")
    from rllm_backends.verl.export import is_verl_checkpoint, merge_verl_checkpoint

    if is_verl_checkpoint(ckpt):  # verl's FSDP shards: verl's own merger writes the model directory
        if fmt != "hf" or merge_lora or role or dtype:
            raise ConfigError(f"{ckpt} is a verl checkpoint: export it as is (--format hf), then convert that folder")
        _prepare(out, force)
        return ExportResult(ckpt, out, merge_verl_checkpoint(ckpt, out), "verl FSDP checkpoint, merged")
    from rllm_backends.tinker.export import download_tinker_checkpoint, is_tinker_checkpoint

    if is_tinker_checkpoint(ckpt):  # the weights live on the Tinker service: the SDK downloads its adapter
        if fmt != "hf" or merge_lora or role or dtype:
            raise ConfigError(f"{ckpt} is a Tinker checkpoint: its LoRA adapter downloads as is (--format hf); "
                              "merge it into the base with peft afterwards")
        _prepare(out, force)
        return ExportResult(ckpt, out, download_tinker_checkpoint(ckpt, out), "Tinker LoRA adapter, downloaded")
    info = checkpoint_info(ckpt)
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if merge_lora and info.kind in ("full", "legacy"):
        raise ConfigError(f"--merge-lora: {ckpt} is a full fine-tune (no LoRA adapter to merge); drop the flag")
    if role is not None and info.kind != "roles":
        raise ConfigError(f"--role {role}: {ckpt} has no per-role adapters (it is a {info.kind} checkpoint)")
    if info.kind == "roles" and role is not None and role not in info.roles:
        raise ConfigError(f"--role {role}: {ckpt} has adapters for {', '.join(info.roles)}")
    _prepare(out, force)
    merged = info.kind in ("full", "legacy") or merge_lora or fmt == "gguf"
    if info.kind == "roles" and merged and role is None:
        raise ConfigError(f"{ckpt} holds one adapter per role ({', '.join(info.roles)}): pick one with --role NAME "
                          "to merge it into the base")
    if not merged:  # the peft adapter(s) as they are, with the tokenizer
        return _copy_adapters(ckpt, out, info.kind, role)
    torch_dtype = getattr(torch, dtype or info.dtype or "float32")
    loaded = load_checkpoint_model(ckpt, dtype=torch.float32, merge=True)
    model = loaded.model
    if info.kind == "roles":
        model = model.merge_and_unload(adapter_names=[role])  # that role's adapter into the base, others dropped
    if fmt == "gguf":
        from rllm_backends.local_torch.export.gguf_writer import write_gguf

        name = dtype or "float32"
        path = write_gguf(model, loaded.tokenizer, out / f"model-{name}.gguf", dtype=name,
                          name=f"rllm {ckpt.parent.parent.name} step {info.step}",
                          pre_tokenizer=_GGUF_PRE.get(str(info.base_model), "default"))
        return ExportResult(ckpt, out, [path], f"GGUF ({name})")
    model = model.to(torch_dtype)
    model.save_pretrained(out, safe_serialization=True)
    loaded.tokenizer.save_pretrained(out)
    what = "merged LoRA" if info.kind != "full" else "full model"
    return ExportResult(ckpt, out, sorted(p for p in out.iterdir() if p.is_file()),
                        f"{what}, {str(torch_dtype).removeprefix('torch.')}")


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not force:
            raise ConfigError(f"{out} exists and is not empty: choose another -o, or pass --force to replace it")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _copy_adapters(ckpt: Path, out: Path, kind: str, role: str | None) -> ExportResult:
    names = ["adapter_config.json", "adapter_model.safetensors"]
    if kind == "lora":
        for name in names:
            shutil.copy2(ckpt / name, out / name)
    elif role is not None:
        for name in names:
            shutil.copy2(ckpt / "adapters" / role / name, out / name)
    else:
        shutil.copytree(ckpt / "adapters", out / "adapters")
    for tok in ckpt.glob("*"):
        if tok.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy2(tok, out / tok.name)
    shutil.copy2(ckpt / "local_backend.json", out / "local_backend.json")  # names the base model
    return ExportResult(ckpt, out, sorted(p for p in out.rglob("*") if p.is_file()),
                        "peft adapter" + ("s (one per role)" if kind == "roles" and role is None else ""))
