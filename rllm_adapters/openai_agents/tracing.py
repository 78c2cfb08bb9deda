"""`RLLMTracingProcessor`: the OpenAI Agents SDK's own spans tell capture which agent makes each call.

The SDK opens an agent span (`AgentSpanData`, with the agent's name) around every turn of an agent, in the
same task that then calls the model, and calls its trace processors synchronously from there. So setting
`rllm.agent_scope(agent name)` in `on_span_start` and undoing it in `on_span_end` names every model request
of that turn — across handoffs, tools and nested agents-as-tools — with no change to the user's agent.
Model calls are logged for the join with their trace and span ids: generation spans (chat completions) by
their messages' fingerprint, response spans (the Responses API, the SDK's default) by the response id, exact.

Runs outside @rllm.rollout get an ad-hoc episode per trace (`adhoc_episodes`).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from agents.tracing import AgentSpanData, GenerationSpanData, ResponseSpanData, Span, Trace, TracingProcessor

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

__all__ = ["RLLMTracingProcessor"]


class RLLMTracingProcessor(TracingProcessor):
    """Sets the agent name around each agent turn; logs model calls; exports nothing anywhere."""

    def __init__(self, max_adhoc_episodes: int = 256) -> None:
        self._lock = threading.Lock()
        self._restore: dict[str, Restore] = {}
        self._agents: dict[str, str] = {}
        self._adhoc: dict[str, tuple[EpisodeContext, Restore]] = {}
        self.adhoc_episodes: deque[Episode] = deque(maxlen=max_adhoc_episodes)
        """Episodes built from runs made outside @rllm.rollout, one per trace, newest last."""

    # ------------------------------------------------------------------------------------- traces
    def on_trace_start(self, trace: Trace) -> None:
        if current_episode() is not None:
            return
        ctx = open_adhoc_episode("openai_agents")
        restore = enter_scopes(episode=ctx)
        with self._lock:
            self._adhoc[trace.trace_id] = (ctx, restore)

    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            entry = self._adhoc.pop(trace.trace_id, None)
        if entry is None:
            return
        ctx, restore = entry
        restore()
        self.adhoc_episodes.append(finish_adhoc_episode(ctx, "openai_agents"))

    # -------------------------------------------------------------------------------------- spans
    def on_span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, AgentSpanData):
            restore = enter_scopes(agent=data.name)
            with self._lock:
                self._restore[span.span_id] = restore
                self._agents[span.span_id] = data.name

    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, AgentSpanData):
            with self._lock:
                restore = self._restore.pop(span.span_id, None)
                self._agents.pop(span.span_id, None)
            if restore is not None:
                restore()
        elif isinstance(data, GenerationSpanData):
            self._log_generation(span, data)
        elif isinstance(data, ResponseSpanData):
            self._log_response(span, data)

    def _log_generation(self, span: Span[Any], data: GenerationSpanData) -> None:
        ctx = current_episode()
        if ctx is None:
            return
        with self._lock:
            agent = self._agents.get(span.parent_id or "") or current_agent()
        messages = data.input if isinstance(data.input, list) else None
        fp = fingerprint(messages) if messages and all(isinstance(m, dict) for m in messages) else None
        call_log.add(ctx.session_id, CallRecord(
            framework="openai_agents", agent=agent, fingerprint=fp,
            metadata={"trace_id": span.trace_id, "span_id": span.span_id, "parent_span_id": span.parent_id,
                      "agent": agent},
        ))

    def _log_response(self, span: Span[Any], data: ResponseSpanData) -> None:
        ctx = current_episode()
        if ctx is None:
            return
        with self._lock:
            agent = self._agents.get(span.parent_id or "") or current_agent()
        rid = getattr(data.response, "id", None) or getattr(data, "_response_id", None)
        call_log.add(ctx.session_id, CallRecord(
            framework="openai_agents", agent=agent, response_id=rid if isinstance(rid, str) else None,
            metadata={"trace_id": span.trace_id, "span_id": span.span_id, "parent_span_id": span.parent_id,
                      "agent": agent},
        ))

    def shutdown(self) -> None:
        return None

    def force_flush(self) -> None:
        return None
