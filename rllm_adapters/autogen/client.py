"""`NamedModelClient`: an AutoGen model client that attributes every call to one agent and one episode.

AutoGen's agents run as handlers inside an agent runtime; the runtime's tasks carry the context of wherever
the runtime was started, which need not be the episode's (a runtime started once outside the episode, or
one reused across episodes). So the episode is not read from the caller's context alone: the wrapped team
binds the episode when `run` / `run_stream` is called (always from the episode's own context), and every
call made by the wrapped clients sets that episode and the agent's name around the request, which is what
in-process capture and the gateway's `X-RLLM-Agent` header read.

Token ids and logprobs come from the wire: autogen-ext 0.7.5 drops logprobs from `create_stream` results, and
never keeps token ids, so nothing here reads them from `CreateResult`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from autogen_core import CancellationToken, ComponentModel
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    ModelCapabilities,  # type: ignore[attr-defined]
    ModelInfo,
    RequestUsage,
)
from autogen_core.tools import Tool, ToolSchema
from pydantic import BaseModel

from rllm_adapters._common import CallRecord, call_log, enter_scopes
from rllm_core.context import EpisodeContext, current_episode

__all__ = ["EpisodeBinding", "NamedModelClient"]


class EpisodeBinding:
    """The episode a wrapped team's calls belong to: bound at each `run`, else the caller's current one."""

    def __init__(self, ctx: EpisodeContext | None = None) -> None:
        self.ctx = ctx

    def resolve(self) -> EpisodeContext | None:
        return self.ctx if self.ctx is not None else current_episode()


class NamedModelClient(ChatCompletionClient):
    """Delegates to `inner`, with the agent name and the bound episode set around every request."""

    component_type = "model"
    component_config_schema = BaseModel  # never serialised itself: dump_component delegates to `inner`

    def __init__(self, inner: ChatCompletionClient, agent: str, binding: EpisodeBinding,
                 team: str | None = None) -> None:
        self.inner = inner
        self.agent = agent
        self.binding = binding
        self.team = team

    def dump_component(self) -> ComponentModel:
        """Serialise as the wrapped client: a saved team loads back without rllm."""
        return self.inner.dump_component()

    @contextmanager
    def _scopes(self, stream: bool) -> Iterator[None]:
        """The bound episode and this agent's name around one request (and its stream)."""
        ctx = self.binding.resolve()
        if ctx is not None:
            call_log.add(ctx.session_id, CallRecord(
                framework="autogen", agent=self.agent,
                metadata={"agent": self.agent, "team": self.team, "stream": stream},
            ))
        # enter_scopes' undo tolerates being run in another context: a stream the agent stops reading early
        # is closed by whoever finalises the generator, not by the task that started it.
        restore = enter_scopes(agent=self.agent, episode=ctx)
        try:
            yield
        finally:
            restore()

    async def create(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = [],
                     tool_choice: Tool | Any = "auto", json_output: bool | type[BaseModel] | None = None,
                     extra_create_args: Mapping[str, Any] = {},
                     cancellation_token: CancellationToken | None = None) -> CreateResult:
        with self._scopes(stream=False):
            return await self.inner.create(messages, tools=tools, tool_choice=tool_choice, json_output=json_output,
                                           extra_create_args=extra_create_args,
                                           cancellation_token=cancellation_token)

    async def create_stream(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = [],
                            tool_choice: Tool | Any = "auto", json_output: bool | type[BaseModel] | None = None,
                            extra_create_args: Mapping[str, Any] = {},
                            cancellation_token: CancellationToken | None = None,
                            ) -> AsyncGenerator[str | CreateResult, None]:
        with self._scopes(stream=True):
            async for item in self.inner.create_stream(messages, tools=tools, tool_choice=tool_choice,
                                                       json_output=json_output, extra_create_args=extra_create_args,
                                                       cancellation_token=cancellation_token):
                yield item

    async def close(self) -> None:
        await self.inner.close()

    def actual_usage(self) -> RequestUsage:
        return self.inner.actual_usage()

    def total_usage(self) -> RequestUsage:
        return self.inner.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return self.inner.count_tokens(messages, tools=tools)

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Tool | ToolSchema] = []) -> int:
        return self.inner.remaining_tokens(messages, tools=tools)

    @property
    def capabilities(self) -> ModelCapabilities:  # type: ignore[override]
        return self.inner.capabilities  # type: ignore[no-any-return]

    @property
    def model_info(self) -> ModelInfo:
        return self.inner.model_info

    def __repr__(self) -> str:
        return f"NamedModelClient(agent={self.agent!r}, inner={self.inner!r})"
