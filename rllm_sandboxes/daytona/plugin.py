"""Registers the `daytona` sandbox provider; the Daytona SDK is imported only when a run starts the provider."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.sandbox import SandboxProviderSpec

__all__ = ["rllm_register_sandbox_providers"]


def _factory(**options: Any) -> Any:
    from rllm_sandboxes.daytona.provider import DaytonaProvider

    return DaytonaProvider(**options)


@hookimpl
def rllm_register_sandbox_providers() -> list[SandboxProviderSpec]:
    return [SandboxProviderSpec(name="daytona", factory=_factory, requires="rllm[daytona]",
                                description="sandboxes in Daytona's cloud of the task's Dockerfile image "
                                            "(needs DAYTONA_API_KEY; network blocked unless the task allows it)")]
