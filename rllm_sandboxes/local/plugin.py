"""Registers the `local` sandbox provider (bubblewrap); nothing is imported from it until a run starts one."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.sandbox import SandboxProviderSpec

__all__ = ["rllm_register_sandbox_providers"]


def _factory(**options: Any) -> Any:
    from rllm_sandboxes.local.provider import LocalSandboxProvider

    return LocalSandboxProvider(**options)


@hookimpl
def rllm_register_sandbox_providers() -> list[SandboxProviderSpec]:
    return [SandboxProviderSpec(
        "local", _factory, requires=None,
        description="bubblewrap on the host's read-only system: no network, rlimits, one uid per sandbox "
                    "(needs `bwrap`: apt-get install bubblewrap)")]
