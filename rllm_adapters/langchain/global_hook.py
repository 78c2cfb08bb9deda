"""Zero-line mode: one `RLLMCallbackHandler` added to every LangChain run in the process.

LangChain's own mechanism for process-wide handlers (the one LangSmith tracing uses) is a configure hook: a
context variable whose value is added to every callback manager LangChain builds. Its default is our global
handler, so every thread and task sees it without anyone passing `callbacks=`. A handler passed explicitly
in a run's config takes precedence for the calls it sees (the two never log a call twice).
"""

from __future__ import annotations

import threading
from contextvars import ContextVar

from langchain_core.tracers.context import register_configure_hook

from rllm_adapters.langchain.handler import RLLMCallbackHandler

__all__ = ["install", "installed_handler", "uninstall"]

_lock = threading.Lock()
_handler: RLLMCallbackHandler | None = None


def install(handler: RLLMCallbackHandler | None = None) -> RLLMCallbackHandler:
    """Capture every LangChain / LangGraph model call in this process; idempotent, returns the global handler.

    A second call re-enables the handler installed first (the configure hook cannot be registered twice);
    `handler` is only used on the first call.
    """
    global _handler
    with _lock:
        if _handler is None:
            _handler = handler or RLLMCallbackHandler()
            var: ContextVar[RLLMCallbackHandler | None] = ContextVar("rllm_langchain_handler", default=_handler)
            register_configure_hook(var, True)
        _handler.enabled = True
        return _handler


def uninstall() -> None:
    """Stop the global handler (it stays registered with LangChain but does nothing)."""
    with _lock:
        if _handler is not None:
            _handler.enabled = False


def installed_handler() -> RLLMCallbackHandler | None:
    """The global handler if `install()` was called and not undone, else None."""
    return _handler if _handler is not None and _handler.enabled else None
