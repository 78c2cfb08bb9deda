"""`RLLMCallbackHandler`: LangChain / LangGraph calls attributed to agents and joined with the wire records.

The handler runs inline (`run_inline = True`): LangChain then calls it in the same context as the model's HTTP
request, for `invoke`, `ainvoke`, `stream` and `astream` alike, so the agent name it sets in
`on_chat_model_start` (and undoes in `on_llm_end`) is what in-process capture sees for that request. The
token ids and logprobs come from the wire; the handler adds the run id, parent run id and LangGraph node to
the matching Step's metadata when the episode ends (see `rllm_adapters._common`).

Outside @rllm.rollout the calls still get recorded: each top-level LangChain run gets an ad-hoc episode,
finished into `handler.adhoc_episodes` when that run ends. A bug in the handler must never break the agent:
LangChain logs (and, with `raise_error = False`, swallows) handler exceptions.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage

from rllm_adapters._common import (
    CallRecord,
    Restore,
    call_log,
    enter_scopes,
    fingerprint,
    finish_adhoc_episode,
    open_adhoc_episode,
)
from rllm_core.context import EpisodeContext, current_agent, current_episode
from rllm_core.types import Episode

__all__ = ["RLLMCallbackHandler", "SplitBy", "node_path"]

SplitBy = Literal["node", "agent", "none"]
"""How calls are named: by LangGraph node (or named agent), only by named agent, or not at all."""

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "function",
          "developer": "developer", "AIMessageChunk": "assistant", "HumanMessageChunk": "user",
          "SystemMessageChunk": "system", "ToolMessageChunk": "tool", "FunctionMessageChunk": "function"}
"""LangChain message type -> OpenAI role, as langchain-openai sends it (for the prompt fingerprint)."""

# A run seen by two RLLM handlers (the global one from `install()` plus one passed in config) is handled
# by the first; the other stays out of it so calls are not logged twice.
_claims: dict[UUID, int] = {}
_claims_lock = threading.Lock()


def _claim(run_id: UUID, handler: object) -> bool:
    with _claims_lock:
        owner = _claims.setdefault(run_id, id(handler))
    return owner == id(handler)


def _release(run_id: UUID) -> None:
    with _claims_lock:
        _claims.pop(run_id, None)


def node_path(metadata: dict[str, Any]) -> str | None:
    """The graph node that made a call, with the nodes of its enclosing graphs: "researcher/agent".

    `langgraph_node` alone is the innermost node's name, and subgraph agents built the same way (e.g. every
    `create_react_agent` names its model node "agent") would all share one trajectory. LangGraph's
    checkpoint namespace ("researcher:<task id>|agent:<task id>") holds the whole path.
    """
    ns = metadata.get("langgraph_checkpoint_ns")
    if isinstance(ns, str) and ns:
        names = [part.split(":", 1)[0] for part in ns.split("|")]
        if all(names):
            return "/".join(names)
    node = metadata.get("langgraph_node")
    return str(node) if node else None


def _to_openai(message: BaseMessage) -> dict[str, Any]:
    role = _ROLES.get(message.type, getattr(message, "role", message.type))
    return {"role": role, "content": message.content}


def _response_id(response: Any) -> str | None:
    """The server's response id, which LangChain keeps in `llm_output` for non-streamed calls only."""
    output = getattr(response, "llm_output", None)
    rid = output.get("id") if isinstance(output, dict) else None
    return rid if isinstance(rid, str) else None


@dataclass
class _OpenCall:
    record: CallRecord
    restore: Restore
    session: EpisodeContext


class RLLMCallbackHandler(BaseCallbackHandler):
    """Names each chat-model call after its LangGraph node / named agent and logs its run ids for the join.

    Args:
        agent: name every call made under this handler with this agent name (overrides everything else).
        split_by: "node" (default) names calls by `lc_agent_name`, else by graph node path (`node_path`:
            "planner" in a flat graph, "researcher/agent" for node "agent" of the subgraph in node
            "researcher"); "agent" only by `lc_agent_name`; "none" leaves names to `rllm.agent_scope` or the
            rollout's name.
        max_adhoc_episodes: how many finished ad-hoc episodes to keep in `adhoc_episodes`.
    """

    run_inline = True
    raise_error = False

    def __init__(self, agent: str | None = None, split_by: SplitBy = "node", max_adhoc_episodes: int = 256) -> None:
        if split_by not in ("node", "agent", "none"):
            raise ValueError(f"split_by must be 'node', 'agent' or 'none', got {split_by!r}")
        self.agent = agent
        self.split_by: SplitBy = split_by
        self.enabled = True
        self.calls: deque[CallRecord] = deque(maxlen=4096)
        """The most recent call records (run ids, node, agent), newest last."""
        self.adhoc_episodes: deque[Episode] = deque(maxlen=max_adhoc_episodes)
        """Episodes built from calls made outside @rllm.rollout, one per top-level LangChain run."""
        self._max_adhoc = max_adhoc_episodes
        self._open: dict[UUID, _OpenCall] = {}
        self._parents: dict[UUID, UUID | None] = {}
        self._adhoc: dict[UUID, EpisodeContext] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its settings only: a handler captured in a rollout shipped to another process (Ray,
        multiprocessing) starts there with no calls in flight; locks and open calls do not travel."""
        return (type(self), (self.agent, self.split_by, self._max_adhoc))

    # Only model calls matter inside an episode; chain events are needed only to group ad-hoc calls by run.
    @property
    def ignore_chain(self) -> bool:
        return not self.enabled or current_episode() is not None

    @property
    def ignore_agent(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------------- naming
    def agent_name(self, metadata: dict[str, Any] | None) -> str | None:
        """The agent a call is attributed to: handler's `agent`, then `rllm.agent_scope`, then metadata."""
        if self.agent is not None:
            return self.agent
        scoped = current_agent()
        if scoped is not None or self.split_by == "none" or not metadata:
            return scoped
        named = metadata.get("lc_agent_name")
        if named:
            return str(named)
        if self.split_by == "node":
            return node_path(metadata)
        return None

    # ------------------------------------------------------------------------------------- model calls
    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *,
                            run_id: UUID, parent_run_id: UUID | None = None, tags: list[str] | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        msgs = [_to_openai(m) for m in messages[0]] if messages else []
        self._start(run_id, parent_run_id, metadata, fingerprint(msgs))

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID,
                     parent_run_id: UUID | None = None, tags: list[str] | None = None,
                     metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._start(run_id, parent_run_id, metadata, None)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, error=None, response_id=_response_id(response))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, error=f"{type(error).__name__}: {error}")

    def _start(self, run_id: UUID, parent_run_id: UUID | None, metadata: dict[str, Any] | None, fp: Any) -> None:
        if not self.enabled or not _claim(run_id, self):
            return
        session = current_episode()
        adhoc = session is None
        if session is None:
            session = self._adhoc_session(run_id, parent_run_id)
        agent = self.agent_name(metadata)
        meta = metadata or {}
        info: dict[str, Any] = {"run_id": str(run_id),
                                "parent_run_id": str(parent_run_id) if parent_run_id else None}
        if "langgraph_node" in meta:
            info["node"] = meta["langgraph_node"]
            info["node_path"] = node_path(meta)
            info["langgraph_step"] = meta.get("langgraph_step")
        if meta.get("lc_agent_name"):
            info["lc_agent_name"] = meta["lc_agent_name"]
        record = CallRecord(framework="langchain", agent=agent, fingerprint=fp, metadata=info)
        restore = enter_scopes(agent=agent if agent != current_agent() else None,
                               episode=session if adhoc else None)
        call_log.add(session.session_id, record)
        self.calls.append(record)
        with self._lock:
            self._open[run_id] = _OpenCall(record, restore, session)

    def _end(self, run_id: UUID, error: str | None, response_id: str | None = None) -> None:
        with self._lock:
            call = self._open.pop(run_id, None)
        if call is None:
            return
        _release(run_id)
        call.record.response_id = response_id
        if error is not None:
            call.record.metadata["error"] = error
        call.restore()
        if call.session.adhoc:
            self._finish_adhoc(run_id, error)

    # ------------------------------------------------------------------------------------ ad-hoc runs
    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        with self._lock:
            self._parents[run_id] = parent_run_id

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish_adhoc(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._finish_adhoc(run_id, f"{type(error).__name__}: {error}")

    def _root(self, run_id: UUID, parent_run_id: UUID | None) -> UUID:
        root, parent = run_id, parent_run_id
        while parent is not None:
            root, parent = parent, self._parents.get(parent)
        return root

    def _adhoc_session(self, run_id: UUID, parent_run_id: UUID | None) -> EpisodeContext:
        with self._lock:
            root = self._root(run_id, parent_run_id)
            session = self._adhoc.get(root)
        if session is None:
            session = open_adhoc_episode("langchain")
            with self._lock:
                session = self._adhoc.setdefault(root, session)
        return session

    def _finish_adhoc(self, run_id: UUID, error: str | None = None) -> None:
        """When a top-level run ends, turn its ad-hoc session into an Episode."""
        with self._lock:
            parent = self._parents.pop(run_id, None)
            if parent is not None:
                return
            session = self._adhoc.pop(run_id, None)
        if session is None:
            return
        self.adhoc_episodes.append(finish_adhoc_episode(session, "langchain", error))
