"""LangChain adapter: `RLLMCallbackHandler` per run, or `install()` for every run in the process.

    from rllm_adapters.langchain import RLLMCallbackHandler
    llm.invoke(messages, config={"callbacks": [RLLMCallbackHandler()]})   # inside an @rllm.rollout function

    import rllm_adapters.langchain; rllm_adapters.langchain.install()   # zero-line: agents nobody may edit

Needs `pip install "rllm[langchain]"`; the names below import LangChain on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllm_adapters._common import lazy_exports
from rllm_adapters.langchain.plugin import TESTED_VERSIONS

if TYPE_CHECKING:
    from rllm_adapters.langchain.global_hook import install, installed_handler, uninstall
    from rllm_adapters.langchain.handler import RLLMCallbackHandler, SplitBy

__all__ = ["TESTED_VERSIONS", "RLLMCallbackHandler", "SplitBy", "install", "installed_handler", "uninstall"]

__getattr__ = lazy_exports(
    {"RLLMCallbackHandler": "rllm_adapters.langchain.handler", "SplitBy": "rllm_adapters.langchain.handler",
     "install": "rllm_adapters.langchain.global_hook", "uninstall": "rllm_adapters.langchain.global_hook",
     "installed_handler": "rllm_adapters.langchain.global_hook"},
    framework="langchain_core", dist="langchain-core", tested=TESTED_VERSIONS, extra="langchain",
    adapter="langchain",
)
