"""A run's checkpoint as a model directory to hand on: Hugging Face layout, optionally merged, cast or GGUF.

The local backend's exporter for `rllm export` (rllm_train.export hands it the checkpoints this backend owns):
loaded with its own tokenizer and chat template, and written with transformers' `save_pretrained` (safetensors,
config, generation config) — or, for LoRA runs without `--merge-lora`, as the peft adapter folder(s) they are.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from rllm_core.errors import ConfigError
from rllm_serve.models import load_checkpoint_model
from rllm_serve.run_model import checkpoint_info
from rllm_train.backend import ExportRequest, ExportResult
from rllm_train.export import prepare_output

__all__ = ["export_local", "owns_local_checkpoint"]

DTYPES = ("float32", "float16", "bfloat16")
_GGUF_PRE = {"smollm2-135m": "smollm", "tiny-random": "smollm"}
"""llama.cpp's pre-tokenizer name per built-in base (both use SmolLM2's tokenizer); others: "default"."""


def owns_local_checkpoint(ckpt: Path) -> bool:
    """A checkpoint of the local backend: a model directory (full, LoRA, per-role adapters) or a `trainer.pt`."""
    return any((ckpt / name).exists() for name in ("local_backend.json", "trainer.pt", "config.json",
                                                   "adapter_config.json", "adapters"))


def export_local(ckpt: Path, request: ExportRequest) -> ExportResult:
    """Write the local checkpoint `ckpt` as `request` asks: the HF folder (merged or cast), the peft adapter(s)
    as they are, or one GGUF file."""
    fmt, merge_lora, role, dtype = request.fmt, request.merge_lora, request.role, request.dtype
    info = checkpoint_info(ckpt)
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if merge_lora and info.kind in ("full", "legacy"):
        raise ConfigError(f"--merge-lora: {ckpt} is a full fine-tune (no LoRA adapter to merge); drop the flag")
    if role is not None and info.kind != "roles":
        raise ConfigError(f"--role {role}: {ckpt} has no per-role adapters (it is a {info.kind} checkpoint)")
    if info.kind == "roles" and role is not None and role not in info.roles:
        raise ConfigError(f"--role {role}: {ckpt} has adapters for {', '.join(info.roles)}")
    merged = info.kind in ("full", "legacy") or merge_lora or fmt == "gguf"
    if info.kind == "roles" and merged and role is None:
        raise ConfigError(f"{ckpt} holds one adapter per role ({', '.join(info.roles)}): pick one with --role NAME "
                          "to merge it into the base")
    out = prepare_output(request)
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
