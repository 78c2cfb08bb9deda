"""`wrap_graph`: bind an `RLLMCallbackHandler` to a compiled graph once, instead of passing it on every call."""

from __future__ import annotations

from typing import Any, TypeVar

from rllm_adapters.langchain.handler import RLLMCallbackHandler, SplitBy

__all__ = ["wrap_graph"]

G = TypeVar("G")


def wrap_graph(graph: G, *, agent: str | None = None, split_by: SplitBy = "node") -> G:
    """Return `graph.with_config(callbacks=[RLLMCallbackHandler(...)])`: same graph, calls named by node.

    The handler only reads metadata and keeps no per-episode state across runs, so one wrapped graph can
    run many episodes at once.
    """
    with_config = getattr(graph, "with_config", None)
    if with_config is None:
        raise TypeError(
            f"wrap_graph expects a LangGraph graph or LangChain runnable (something with .with_config), "
            f"got {type(graph).__name__}; pass callbacks=[RLLMCallbackHandler()] in its config instead"
        )
    handler: Any = RLLMCallbackHandler(agent=agent, split_by=split_by)
    return with_config({"callbacks": [handler]})  # type: ignore[no-any-return]
