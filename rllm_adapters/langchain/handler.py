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
from collections.abc import Mapping
from contextvars import ContextVar, Token
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
from rllm_core.context import CallAgentName, EpisodeContext, current_agent, current_episode
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


_PUSH = "__pregel_push"
_NS_SEP = "|"


def send_index(metadata: Mapping[str, Any]) -> int | None:
    """The index of the `Send` that started this LangGraph task, or None for an ordinary (pulled) task.

    LangGraph gives a task started by `Send` the path ("__pregel_push", <index in the step's Send list>,
    False); a functional-API `@task` call also runs as a push, but with a tuple there (its caller's path):
    those keep their plain names.
    """
    path = metadata.get("langgraph_path")
    if isinstance(path, tuple) and len(path) >= 2 and path[0] == _PUSH and type(path[1]) is int:
        return path[1]
    return None


def _segments(metadata: Mapping[str, Any], branches: Mapping[str, int] | None = None) -> list[str]:
    """One name per graph level of the call, a `Send` branch suffixed with its index ("worker#1")."""
    ns = metadata.get("langgraph_checkpoint_ns")
    if isinstance(ns, str) and ns:
        parts = ns.split(_NS_SEP)
        names = [part.split(":", 1)[0] for part in parts]
        if all(names):
            own = send_index(metadata)
            for i in range(len(parts)):
                idx = own if i == len(parts) - 1 and own is not None else (
                    branches.get(_NS_SEP.join(parts[:i + 1])) if branches else None)
                if idx is not None:
                    names[i] = f"{names[i]}#{idx}"
            return names
    node = metadata.get("langgraph_node")
    if not node:
        return []
    own = send_index(metadata)
    return [f"{node}#{own}" if own is not None else str(node)]


def node_path(metadata: Mapping[str, Any], branches: Mapping[str, int] | None = None) -> str | None:
    """The graph node that made a call, with the nodes of its enclosing graphs: "researcher/agent".

    `langgraph_node` alone is the innermost node's name, and subgraph agents built the same way (e.g. every
    `create_react_agent` names its model node "agent") would all share one trajectory. LangGraph's
    checkpoint namespace ("researcher:<task id>|agent:<task id>") holds the whole path.

    Parallel branches made by `Send` run one node several times in one step; each is named after its index
    in that step's Send list, "worker#0", "worker#1" (stable across episodes, unlike the task ids, so the
    same branch lines up from one episode to the next). An enclosing level's index is not in the call's own
    metadata: `branches` (checkpoint namespace of a Send task -> index, which the handler learns from the
    task's chain start) supplies it, "researcher#1/agent".
    """
    names = _segments(metadata, branches)
    return "/".join(names) if names else None


@dataclass(frozen=True)
class _ToolRun:
    """The tool a call is made inside of (a tool that itself calls a model), and the graph node running it."""

    name: str
    ns: str
    """The checkpoint namespace of the node running the tool: calls under it are named after the tool."""
    depth: int
    """How many graph levels that node is deep (its level gets the ":<tool name>" suffix)."""
    outer: _ToolRun | None = None
    """The tool this one runs inside of (a tool running a subgraph whose own tools call models)."""


_tool_run: ContextVar[_ToolRun | None] = ContextVar("rllm_langchain_tool_run", default=None)
"""Set from a tool's start to its end; LangChain runs the tool body in a copy of that context."""


def _to_openai(message: BaseMessage) -> dict[str, Any]:
    role = _ROLES.get(message.type, getattr(message, "role", message.type))
    return {"role": role, "content": message.content}


def _response_id(response: Any) -> str | None:
    """The server's response id, which LangChain keeps in `llm_output` for non-streamed calls only."""
    output = getattr(response, "llm_output", None)
    rid = output.get("id") if isinstance(output, dict) else None
    return rid if isinstance(rid, str) else None


class _CallName(CallAgentName):
    """An agent name this handler set for one model call, with the name it covered (`previous`).

    The handler sets the name in `on_chat_model_start` and undoes it in `on_llm_end`, but an async chat model
    (`await llm.ainvoke(...)`) sends its end event from a task of its own (`asyncio.gather`), a copy of the
    context where the name cannot be undone: it stays set where the call was made. Marked like this and ended
    in `on_llm_end` (`CallAgentName.end`), a name left behind is looked past by `current_agent()`: not taken for
    the user's `rllm.agent_scope`, nor for the agent of any later call of that context, LangChain's or not.
    """

    @classmethod
    def of(cls, name: str | None) -> str | None:
        return None if name is None else cls.covering(name, _user_agent())


def _user_agent() -> str | None:
    """The agent name of an enclosing `rllm.agent_scope`, past any name a handler left behind."""
    scoped = current_agent()
    return scoped.previous if isinstance(scoped, _CallName) else scoped


@dataclass
class _OpenCall:
    record: CallRecord
    restore: Restore
    session: EpisodeContext
    name: str | None = None


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
        self._branches: dict[str, int] = {}
        """Checkpoint namespace of each running `Send` task -> its Send index (see `node_path`)."""
        self._branch_runs: dict[UUID, str] = {}
        """The chain run that recorded each `_branches` entry, which removes it when it ends."""
        self._tools: dict[UUID, Token[_ToolRun | None]] = {}
        self._adhoc: dict[UUID, EpisodeContext] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its settings only: a handler captured in a rollout shipped to another process (Ray,
        multiprocessing) starts there with no calls in flight; locks and open calls do not travel."""
        return (type(self), (self.agent, self.split_by, self._max_adhoc))

    # Chain events: to learn the Send index of running graph tasks (for the calls of subgraphs they run),
    # and outside an episode to group ad-hoc calls by top-level run.
    @property
    def ignore_chain(self) -> bool:
        return not self.enabled

    @property
    def ignore_agent(self) -> bool:
        """LangChain gates tool events by this too: they mark calls made inside a tool (see on_tool_start)."""
        return not self.enabled

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
        scoped = _user_agent()
        if scoped is not None or self.split_by == "none" or not metadata:
            return scoped
        named = metadata.get("lc_agent_name")
        if named:
            return str(named)
        if self.split_by == "node":
            return self._node_name(metadata)
        return None

    def _node_name(self, metadata: Mapping[str, Any]) -> str | None:
        """The node path, with the tool's name on the level of the node running it: "tools:search".

        A call made inside a tool (a tool that asks a model) would otherwise be named after the tool node
        (LangGraph's ToolNode: "tools"), merging the calls of every tool into one trajectory.
        """
        names = _segments(metadata, self._branches)
        tool = _tool_run.get()
        ns = metadata.get("langgraph_checkpoint_ns")
        while tool is not None and isinstance(ns, str):
            if 0 < tool.depth <= len(names) and (ns == tool.ns or ns.startswith(tool.ns + _NS_SEP)):
                names[tool.depth - 1] = f"{names[tool.depth - 1]}:{tool.name}"
            tool = tool.outer
        return "/".join(names) if names else None

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
            info["node_path"] = node_path(meta, self._branches)
            info["langgraph_step"] = meta.get("langgraph_step")
            if (index := send_index(meta)) is not None:
                info["send_index"] = index
        tool = _tool_run.get()
        if tool is not None:
            info["tool"] = tool.name
        if meta.get("lc_agent_name"):
            info["lc_agent_name"] = meta["lc_agent_name"]
        record = CallRecord(framework="langchain", agent=agent, fingerprint=fp, metadata=info)
        name = _CallName.of(agent) if agent != current_agent() else None
        restore = enter_scopes(agent=name, episode=session if adhoc else None)
        call_log.add(session.session_id, record)
        self.calls.append(record)
        with self._lock:
            self._open[run_id] = _OpenCall(record, restore, session, name)

    def _end(self, run_id: UUID, error: str | None, response_id: str | None = None) -> None:
        with self._lock:
            call = self._open.pop(run_id, None)
        if call is None:
            return
        _release(run_id)
        call.record.response_id = response_id
        if error is not None:
            call.record.metadata["error"] = error
        if isinstance(call.name, CallAgentName):
            call.name.end()  # seen from the context the call started in, where restore() may not reach
        call.restore()
        if call.session.adhoc:
            self._finish_adhoc(run_id, error)

    # ------------------------------------------------------------------------------------------- tools
    def on_tool_start(self, serialized: dict[str, Any] | None, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                      **kwargs: Any) -> None:
        """Mark the tool's body (which LangChain runs in a copy of this context) as inside this tool."""
        ns = (metadata or {}).get("langgraph_checkpoint_ns")
        if not self.enabled or not isinstance(ns, str) or not ns or not _claim(run_id, self):
            return  # a tool outside a graph: its calls keep their names
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        token = _tool_run.set(_ToolRun(name=str(name), ns=ns, depth=len(ns.split(_NS_SEP)), outer=_tool_run.get()))
        with self._lock:
            self._tools[run_id] = token

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_tool(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_tool(run_id)

    def _end_tool(self, run_id: UUID) -> None:
        with self._lock:
            token = self._tools.pop(run_id, None)
        if token is None:
            return
        _release(run_id)
        try:
            _tool_run.reset(token)
        except ValueError:  # ended in another context than it started: nothing of ours is set here
            pass

    # ----------------------------------------------------------------------- graph tasks, ad-hoc runs
    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, metadata: dict[str, Any] | None = None,
                       **kwargs: Any) -> None:
        if metadata and (index := send_index(metadata)) is not None:
            ns = metadata.get("langgraph_checkpoint_ns")
            # the task's first chain records it; the chains inside the task see the same namespace
            if isinstance(ns, str) and ns not in self._branches:
                with self._lock:
                    self._branches[ns] = index
                    self._branch_runs[run_id] = ns
        if current_episode() is None:
            with self._lock:
                self._parents[run_id] = parent_run_id

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_chain(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_chain(run_id, f"{type(error).__name__}: {error}")

    def _end_chain(self, run_id: UUID, error: str | None = None) -> None:
        if run_id in self._branch_runs:
            with self._lock:
                ns = self._branch_runs.pop(run_id, None)
                if ns is not None:
                    self._branches.pop(ns, None)
        if run_id in self._parents or run_id in self._adhoc:
            self._finish_adhoc(run_id, error)

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
