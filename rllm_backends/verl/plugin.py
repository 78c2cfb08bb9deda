"""Registers the `verl` training backend (verl's own workers on Ray; CPU or a GPU cluster)."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import BackendSpec

__all__ = ["rllm_register_backends"]


def _factory(config: Any) -> Any:
    from rllm_backends.verl.backend import VerlBackend

    return VerlBackend(config)


@hookimpl
def rllm_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="verl", factory=_factory, requires="rllm[verl]",
                        description="verl 0.9 workers on Ray: FSDP actor + vLLM/SGLang replicas (GPU), or CPU")]
