"""OpenAI SDK (`wrap_client`) and OpenAI Agents SDK adapters against the fake upstream."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import openai
import psutil
import pytest
from agents import Agent, Runner, function_tool
from agents.tracing import get_trace_provider
from agents.tracing.processors import default_processor
from test_adapter_support import (
    assert_wire_exact,
    episode_text,
    fresh_warnings,  # noqa: F401  (autouse: once-only warnings fire again per test)
    trajectory_shape,
)
from test_responses_api import assert_responses_exact

import rllm
from rllm_adapters.openai_agents import install, run_config
from rllm_adapters.openai_sdk import AGENT_HEADER, agent_of, wrap_client
from rllm_core.types import Step
from rllm_testing.fake_upstream import FakeUpstream


def assert_call_exact(up: FakeUpstream, step: Step) -> None:
    """`assert_wire_exact` for chat / completions Steps, its Responses twin for the Agents SDK's default model."""
    (assert_responses_exact if step.endpoint == "responses" else assert_wire_exact)(up, step)


def endpoint(config: rllm.RolloutConfig) -> str:
    return str(config.upstream_url) if getattr(config, "direct", False) else config.base_url


# --------------------------------------------------------------------------------------- wrap_client
@rllm.rollout
def sync_clients(task: rllm.Task, config: rllm.RolloutConfig) -> None:
    base = openai.OpenAI(base_url=endpoint(config), api_key=config.api_key, max_retries=0)
    solver, critic = wrap_client(base, name="solver"), wrap_client(base, name="critic")
    msgs: Any = [{"role": "user", "content": "question"}]
    solver.chat.completions.create(model="fake", messages=msgs)
    for _ in critic.chat.completions.create(model="fake", messages=msgs, stream=True):
        pass
    solver.with_options(timeout=30).completions.create(model="fake", prompt="complete me")
    base.chat.completions.create(model="fake", messages=msgs)  # the unwrapped client: the rollout's name


@rllm.rollout
async def async_clients(task: rllm.Task, config: rllm.RolloutConfig) -> None:
    base = openai.AsyncOpenAI(base_url=endpoint(config), api_key=config.api_key, max_retries=0)
    solver = wrap_client(base, name="solver")
    msgs: Any = [{"role": "user", "content": str(task.instruction)}]
    stream = await solver.chat.completions.create(model="fake", messages=msgs, stream=True)
    async for _ in stream:
        pass
    await wrap_client(solver, name="critic").chat.completions.create(model="fake", messages=msgs)


@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
def test_wrap_client_names_sync_calls(fake_upstream: FakeUpstream, direct: bool) -> None:
    episode = sync_clients.run({"id": "s"}, base_url=fake_upstream.base_url, direct=direct)
    assert episode.termination_reason == "completed", episode.error
    assert [s.agent for s in episode.steps] == ["solver", "critic", "solver", None]
    assert trajectory_shape(episode) == [("solver", 2), ("critic", 1), ("sync_clients", 1)]
    assert episode.steps[2].endpoint == "completions"
    for step in episode.steps:
        assert_wire_exact(fake_upstream, step)


@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
async def test_wrap_client_names_async_streaming_calls(fake_upstream: FakeUpstream, direct: bool) -> None:
    episode = await async_clients.arun({"id": "a", "instruction": "async q"}, base_url=fake_upstream.base_url,
                                       direct=direct)
    assert trajectory_shape(episode) == [("solver", 1), ("critic", 1)]
    for step in episode.steps:
        assert_wire_exact(fake_upstream, step)


def test_wrap_client_keeps_the_original_and_checks_input() -> None:
    base = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="EMPTY")
    named = wrap_client(base, name="solver")
    assert isinstance(named, openai.OpenAI) and agent_of(named) == "solver"
    assert agent_of(base) is None and AGENT_HEADER not in base.default_headers
    assert agent_of(wrap_client(named, name="critic")) == "critic" and agent_of(named) == "solver"
    with pytest.raises(ValueError, match="non-empty agent name"):
        wrap_client(base, name="")
    with pytest.raises(TypeError, match="agent_scope"):
        wrap_client(object(), name="x")


# ------------------------------------------------------------------------------------ OpenAI Agents SDK
@function_tool
def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


@rllm.rollout
async def agents_rollout(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    math = Agent(name="math", instructions="Use the tool.", tools=[add_one])
    start = Agent(name="triage", instructions="Route.", handoffs=[math]) if task.metadata.get("handoff") else math
    if getattr(config, "stream", False):
        streamed = Runner.run_streamed(start, str(task.instruction), run_config=run_config(config))
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)
    result = await Runner.run(start, str(task.instruction), run_config=run_config(config))
    return str(result.final_output)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_agents_sdk_agent_with_tool(fake_upstream: FakeUpstream, stream: bool) -> None:
    episode = await agents_rollout.arun({"id": "m", "instruction": "2+2"}, base_url=fake_upstream.base_url,
                                        stream=stream)
    assert episode.termination_reason == "completed", episode.error
    assert trajectory_shape(episode) == [("math", 2)]
    first, second = episode.steps
    assert first.tool_calls and first.tool_calls[0]["function"]["name"] == "add_one"
    assert any(m.get("role") == "tool" for m in second.messages or [])
    for step in episode.steps:
        assert_call_exact(fake_upstream, step)
        assert step.metadata["framework"] == "openai_agents" and step.metadata["trace_id"].startswith("trace_")
    assert all("/chat/completions" not in str(r) for r in fake_upstream.requests)  # bodies, not URLs
    assert all("input" in r and "messages" not in r for r in fake_upstream.requests)  # the SDK's default API


async def test_agents_sdk_handoff_names_each_agent_concurrently(fake_upstream: FakeUpstream) -> None:
    episodes = await asyncio.gather(*(
        agents_rollout.arun({"id": f"h{i}", "instruction": f"route {i}", "metadata": {"handoff": True}},
                            base_url=fake_upstream.base_url, stream=i % 2 == 1)
        for i in range(4)
    ))
    for i, episode in enumerate(episodes):
        assert trajectory_shape(episode) == [("triage", 1), ("math", 1)], episode.error
        assert episode.trajectory("triage").steps[0].tool_calls[0]["function"]["name"] == "transfer_to_math"
        assert all(f"route {j}" not in episode_text(episode) for j in range(4) if j != i)
        for step in episode.steps:
            assert_call_exact(fake_upstream, step)


async def test_agents_sdk_outside_rollout_is_adhoc(fake_upstream: FakeUpstream) -> None:
    processor = install()
    agent = Agent(name="loose", instructions="Use the tool.", tools=[add_one])
    before = len(processor.adhoc_episodes)
    with pytest.warns(UserWarning, match="outside an @rllm.rollout"):
        await Runner.run(agent, "no rollout", run_config=run_config(base_url=fake_upstream.base_url, model="fake"))
    assert len(processor.adhoc_episodes) == before + 1
    episode = processor.adhoc_episodes[-1]
    assert trajectory_shape(episode) == [("loose", 2)]
    for step in episode.steps:
        assert_call_exact(fake_upstream, step)
    with pytest.raises(ValueError, match="base_url"):
        run_config()


def trace_processors() -> list[Any]:
    """The SDK's registered trace processors (no public getter: read from its multi-processor)."""
    return list(get_trace_provider()._multi_processor._processors)  # type: ignore[attr-defined]


def test_agents_sdk_install_exports_nothing_unless_asked(fake_upstream: FakeUpstream) -> None:
    processor = install()
    try:
        assert trace_processors() == [processor]  # OpenAI's exporter is gone: nothing calls out offline
        assert install() is processor and trace_processors() == [processor]  # idempotent, never doubled
        install(export_traces=True)
        run_config(base_url=fake_upstream.base_url, model="fake")  # must not undo the user's choice
        assert trace_processors() == [processor, default_processor()]
    finally:
        install()
    assert trace_processors() == [processor]


def test_agents_sdk_episodes_leave_no_connections_open(fake_upstream: FakeUpstream) -> None:
    """Nobody closes a RunConfig's client: it must hold no idle keep-alive socket once a run is over."""
    ports: list[int] = []

    @rllm.rollout
    async def short(task: rllm.Task, config: rllm.RolloutConfig) -> str:
        ports.append(int(str(urlsplit(config.base_url).port)))
        result = await Runner.run(Agent(name="a", instructions="Answer."), "hi", run_config=run_config(config))
        return str(result.final_output)

    for i in range(3):
        assert short.run({"id": f"c{i}"}, base_url=fake_upstream.base_url).termination_reason == "completed"
    open_to_gateway = [c for c in psutil.Process().net_connections("tcp")
                       if c.raddr and c.raddr.port == ports[0] and c.status == psutil.CONN_ESTABLISHED]
    assert open_to_gateway == []
