"""`wrap_client`: an OpenAI SDK client whose every request is attributed to one agent name.

Capture of plain OpenAI SDK calls needs no adapter (in-process capture patches the HTTP layer under it).
What the wrapper adds is the name: the copy it returns sends `X-RLLM-Agent: <name>` (which the gateway
records) and sets `rllm.agent_scope(name)` around each request (which in-process capture records), so
chat completions, completions, Responses API (`client.responses.create`) and streaming calls all land in the
`<name>` trajectory.

The copy is an instance of a small subclass of the client's own class (made once per class), so it is
still an `openai.OpenAI` / `AsyncOpenAI` for type checks, and `with_options` copies of it keep the name.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, TypeVar

from rllm_core.context import AGENT_HEADER, agent_scope

__all__ = ["AGENT_HEADER", "agent_of", "wrap_client"]


C = TypeVar("C")

_classes: dict[type, type] = {}
_lock = threading.Lock()


def agent_of(client: Any) -> str | None:
    """The agent name a wrapped client attributes its calls to (None for an unwrapped client)."""
    if not getattr(type(client), "__rllm_named__", False):
        return None
    value = client.default_headers.get(AGENT_HEADER)
    return value if isinstance(value, str) else None


def _named_class(base: type) -> type:
    with _lock:
        cls = _classes.get(base)
        if cls is not None:
            return cls
        if inspect.iscoroutinefunction(base.request):

            @functools.wraps(base.request)
            async def arequest(self: Any, *args: Any, **kwargs: Any) -> Any:
                with agent_scope(agent_of(self)):
                    return await base.request(self, *args, **kwargs)

            method: Any = arequest
        else:

            @functools.wraps(base.request)
            def request(self: Any, *args: Any, **kwargs: Any) -> Any:
                with agent_scope(agent_of(self)):
                    return base.request(self, *args, **kwargs)

            method = request
        cls = type(f"Named{base.__name__}", (base,), {"request": method, "__rllm_named__": True,
                                                       "__module__": __name__})
        _classes[base] = cls
        return cls


def wrap_client(client: C, name: str) -> C:
    """Return a copy of `client` (openai.OpenAI, AsyncOpenAI, Azure...) whose calls are named `name`.

    The original client is left as it was; wrapping a wrapped client renames the copy.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"wrap_client needs a non-empty agent name, got {name!r}")
    base = type(client)
    if getattr(base, "__rllm_named__", False):
        base = base.__mro__[1]
    if not (hasattr(client, "with_options") and hasattr(base, "request")):
        raise TypeError(
            f"wrap_client expects an OpenAI SDK client (openai.OpenAI / openai.AsyncOpenAI), got "
            f"{type(client).__name__}; for other clients use `with rllm.agent_scope({name!r}):` around the calls"
        )
    named = client.with_options(default_headers={AGENT_HEADER: name})  # type: ignore[attr-defined]
    named.__class__ = _named_class(base)
    return named  # type: ignore[no-any-return]
