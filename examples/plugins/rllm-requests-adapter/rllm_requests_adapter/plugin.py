"""The rllm entry point: registers the adapter and starts capture when rllm loads its plugins."""

from __future__ import annotations

from rllm_core.adapters import AdapterSpec
from rllm_core.hookspecs import hookimpl
from rllm_requests_adapter.capture import install

__all__ = ["rllm_register_adapters"]


@hookimpl
def rllm_register_adapters() -> list[AdapterSpec]:
    return [AdapterSpec(
        name="requests", module="rllm_requests_adapter", framework="requests", extra=None,
        tested_versions=">=2.28,<3", description="captures chat/completions calls made with requests",
    )]


install()  # loading the plugin is opting in: patch requests now (idempotent, a no-op outside episodes)
