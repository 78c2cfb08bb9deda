"""Registers the `local` training backend (in-process torch trainer + policy server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm_backends.local_torch.options import LocalOptions
from rllm_core.hookspecs import hookimpl
from rllm_train.backend import BackendSpec

__all__ = ["rllm_register_backends"]


def _factory(config: Any) -> Any:
    from rllm_backends.local_torch.backend import LocalTorchBackend

    return LocalTorchBackend(config)


def _owns(ckpt: Path) -> bool:
    from rllm_backends.local_torch.export.hf import owns_local_checkpoint

    return owns_local_checkpoint(ckpt)


def _export(ckpt: Path, request: Any) -> Any:
    from rllm_backends.local_torch.export.hf import export_local

    return export_local(ckpt, request)


@hookimpl
def rllm_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="local", factory=_factory, requires="rllm[train]", owns_checkpoint=_owns, export=_export,
                        options=LocalOptions,
                        description="in-process torch trainer + local policy server (CPU or one GPU)")]
