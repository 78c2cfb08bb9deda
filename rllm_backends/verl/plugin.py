"""Registers the `verl` training backend (verl's own workers on Ray; CPU or a GPU cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_train.backend import BackendSpec

__all__ = ["rllm_register_backends"]


def _factory(config: Any) -> Any:
    from rllm_backends.verl.backend import VerlBackend

    return VerlBackend(config)


def _owns(ckpt: Path) -> bool:
    from rllm_backends.verl.export import is_verl_checkpoint

    return is_verl_checkpoint(ckpt)


def _export(ckpt: Path, request: Any) -> Any:
    from rllm_backends.verl.export import export_verl

    return export_verl(ckpt, request)


@hookimpl
def rllm_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="verl", factory=_factory, requires="rllm[verl]", owns_checkpoint=_owns, export=_export,
                        options=None,  # verl config keys: checked by verl's own config composition
                        description="verl 0.9 workers on Ray: FSDP actor + vLLM/SGLang replicas (GPU), or CPU")]
