"""Registers the `local` training backend (in-process torch trainer + policy server)."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import BackendSpec

__all__ = ["rllm_register_backends"]


def _factory(config: Any) -> Any:
    from rllm_backends.local_torch.backend import LocalTorchBackend

    return LocalTorchBackend(config)


@hookimpl
def rllm_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="local", factory=_factory, requires="rllm[train]",
                        description="in-process torch trainer + local policy server (CPU or one GPU)")]
