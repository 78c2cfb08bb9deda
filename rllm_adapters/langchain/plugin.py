"""The rllm plugin of the LangChain adapter: registers its AdapterSpec and joins its call records.

Kept free of LangChain imports: the plugin manager loads every plugin module, installed framework or not.
With `RLLM_LANGCHAIN_AUTO=1` in the environment, loading the plugin also runs `install()` (zero-line mode).
"""

from __future__ import annotations

import os
from typing import Any

from rllm_adapters._common import call_log, check_version, require_framework
from rllm_core.adapters import AdapterSpec
from rllm_core.hookspecs import hookimpl

__all__ = ["AUTO_ENV", "TESTED_VERSIONS", "rllm_on_episode_end", "rllm_register_adapters"]

TESTED_VERSIONS = ">=1.0,<2"
"""langchain-core versions the adapter was tested with."""
AUTO_ENV = "RLLM_LANGCHAIN_AUTO"


@hookimpl
def rllm_register_adapters() -> list[AdapterSpec]:
    return [AdapterSpec(
        name="langchain", module="rllm_adapters.langchain", framework="langchain-core", extra="langchain",
        tested_versions=TESTED_VERSIONS,
        description="RLLMCallbackHandler / install(): names calls by agent, joins run ids with wire records",
    )]


@hookimpl
def rllm_on_episode_end(episode: Any) -> None:
    call_log.join(episode, framework="langchain")


def _auto_install() -> None:
    """Zero-line mode from the environment; the package `__init__` may still be importing us, so go direct."""
    try:
        require_framework("langchain_core", extra="langchain", adapter="langchain")
    except ImportError:
        return  # LangChain not installed: nothing to capture
    check_version("langchain-core", TESTED_VERSIONS, adapter="langchain")
    from rllm_adapters.langchain.global_hook import install

    install()


if os.environ.get(AUTO_ENV, "").lower() in ("1", "true", "yes"):
    _auto_install()
