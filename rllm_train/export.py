"""`rllm export`'s library side: a run's checkpoint handed to the backend that wrote it.

Each backend knows its own checkpoints: the local one writes model directories (exported as Hugging Face
folders or GGUF), verl writes FSDP shards (its own merger), Tinker keeps the weights on its service (its SDK
downloads them). A backend says so in its BackendSpec (`owns_checkpoint`, `export`); this module resolves the
checkpoint like `--model` does and hands it to the one backend that owns it, so no backend knows another.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rllm_core.errors import ConfigError
from rllm_train.backend import ExportRequest, ExportResult, get_backends

__all__ = ["export_checkpoint", "prepare_output"]

FORMATS = ("hf", "gguf")


def prepare_output(request: ExportRequest) -> Path:
    """The output folder, new or emptied (`force`); called by a backend's exporter once the request is valid."""
    out = request.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not request.force:
            raise ConfigError(f"{out} exists and is not empty: choose another -o, or pass --force to replace it")
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def export_checkpoint(spec: str, out: Path, *, step: int | None = None, merge_lora: bool = False,
                      role: str | None = None, dtype: str | None = None, fmt: str = "hf",
                      force: bool = False) -> ExportResult:
    """Write the checkpoint `spec` names (a run: its newest unless `step`; `RUN:step_N`; a checkpoint dir)."""
    from rllm_serve.run_model import resolve_checkpoint

    ckpt = resolve_checkpoint(spec, step)
    if ckpt is None:
        raise ConfigError(f"{spec} is not a run or checkpoint of rllm train (expected a folder with checkpoints/, "
                          "or checkpoints/step_N)")
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: use {' or '.join(FORMATS)}")
    request = ExportRequest(out=Path(out), fmt=fmt, merge_lora=merge_lora, role=role, dtype=dtype, force=force)
    specs = get_backends()
    owners = [s for s in specs.values() if s.export is not None and s.owns_checkpoint is not None
              and s.owns_checkpoint(ckpt)]
    if not owners:
        able = ", ".join(sorted(n for n, s in specs.items() if s.export is not None)) or "none"
        raise ConfigError(f"{ckpt} is not a checkpoint any installed backend exports (backends that export: {able}): "
                          "is it a checkpoint of rllm train?")
    if len(owners) > 1:
        raise ConfigError(f"{ckpt} looks like a checkpoint of several backends ({', '.join(s.name for s in owners)});"
                          " export it from a checkpoint directory that holds one backend's files")
    export = owners[0].export
    assert export is not None
    return export(ckpt, request)
