"""Registers the `docker` sandbox provider; the docker SDK is imported only when a run starts the provider."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.sandbox import SandboxProviderSpec

__all__ = ["rllm_register_sandbox_providers"]


def _factory(**options: Any) -> Any:
    from rllm_sandboxes.docker.provider import DockerProvider

    return DockerProvider(**options)


@hookimpl
def rllm_register_sandbox_providers() -> list[SandboxProviderSpec]:
    return [SandboxProviderSpec(name="docker", factory=_factory, requires="rllm[docker]",
                                description="containers of the task's Dockerfile image, through a local Docker "
                                            "daemon (no network unless the task allows it)")]
