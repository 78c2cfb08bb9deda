"""The rllm plugin of the OpenAI SDK adapter: registers its AdapterSpec (capture itself is in the core)."""

from __future__ import annotations

from rllm_core.adapters import AdapterSpec
from rllm_core.hookspecs import hookimpl

__all__ = ["TESTED_VERSIONS", "rllm_register_adapters"]

TESTED_VERSIONS = ">=1.40,<4"
"""openai (Python SDK) versions the adapter was tested with."""


@hookimpl
def rllm_register_adapters() -> list[AdapterSpec]:
    return [AdapterSpec(
        name="openai_sdk", module="rllm_adapters.openai_sdk", framework="openai", extra=None,
        tested_versions=TESTED_VERSIONS,
        description="wrap_client(client, name=...): names the calls of a plain OpenAI SDK client",
    )]
