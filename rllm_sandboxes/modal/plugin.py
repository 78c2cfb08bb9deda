"""Registers the `modal` sandbox provider; the Modal SDK is imported only when a run starts the provider."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.sandbox import SandboxProviderSpec

__all__ = ["rllm_register_sandbox_providers"]


def _factory(**options: Any) -> Any:
    from rllm_sandboxes.modal.provider import ModalProvider

    return ModalProvider(**options)


@hookimpl
def rllm_register_sandbox_providers() -> list[SandboxProviderSpec]:
    return [SandboxProviderSpec(name="modal", factory=_factory, requires="rllm[modal]",
                                description="sandboxes in Modal's cloud of the task's Dockerfile image "
                                            "(needs Modal credentials; network blocked unless the task allows it)")]
