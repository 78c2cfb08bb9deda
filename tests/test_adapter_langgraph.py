"""LangGraph / LangChain adapter against the fake upstream: a real two-node graph with a tool call.

Graph: planner (one plain call) -> agent (tool-bound model: calls `add_one`, then answers) -> tools -> agent.
So every episode must hold trajectories [("planner", 1), ("agent", 2)], each step with the server's ids.
"""

from __future__ import annotations

import asyncio
import math
import os
import pickle
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from test_adapter_support import (
    assert_wire_exact,
    episode_text,
    fresh_warnings,  # noqa: F401  (autouse: once-only warnings fire again per test)
    trajectory_shape,
)

import rllm
from rllm_adapters._common import AdapterWarning
from rllm_adapters.langgraph import RLLMCallbackHandler, install, uninstall, wrap_graph
from rllm_core.testing.fake_upstream import FakeUpstream

SHAPE = [("planner", 1), ("agent", 2)]


@tool
def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(base_url: str, streaming: bool = False, async_agent: bool | None = None) -> Any:
    llm = ChatOpenAI(model="fake", base_url=base_url, api_key="EMPTY", streaming=streaming, max_retries=0)
    tooled = llm.bind_tools([add_one])

    def planner(state: State) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    async def agent(state: State) -> dict[str, Any]:
        return {"messages": [await tooled.ainvoke(state["messages"])]}

    def agent_sync(state: State) -> dict[str, Any]:
        return {"messages": [tooled.invoke(state["messages"])]}

    g = StateGraph(State)
    g.add_node("planner", planner)
    g.add_node("agent", agent if (streaming if async_agent is None else async_agent) else agent_sync)
    g.add_node("tools", ToolNode([add_one]))
    g.add_edge(START, "planner")
    g.add_edge("planner", "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def endpoint(config: rllm.RolloutConfig) -> str:
    """The gateway session URL, or with `direct=True` the upstream itself (in-process capture, by context)."""
    return str(config.upstream_url) if getattr(config, "direct", False) else config.base_url


@rllm.rollout
def sync_graph(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    graph = build_graph(endpoint(config), streaming=bool(getattr(config, "stream", False)), async_agent=False)
    out = graph.invoke({"messages": [HumanMessage(str(task.instruction))]},
                       config={"callbacks": [RLLMCallbackHandler()]})
    return str(out["messages"][-1].content)


@rllm.rollout
async def streaming_graph(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    """Async + streamed: `astream` with token streaming in both nodes, one node async."""
    graph = wrap_graph(build_graph(endpoint(config), streaming=True))
    last = None
    async for update in graph.astream({"messages": [HumanMessage(str(task.instruction))]}, stream_mode="values"):
        last = update
    assert last is not None
    return str(last["messages"][-1].content)


def check_episode(up: FakeUpstream, episode: rllm.Episode) -> None:
    assert episode.termination_reason == "completed", episode.error
    assert trajectory_shape(episode) == SHAPE
    for traj in episode.trajectories:
        for step in traj.steps:
            assert step.agent == traj.name
            assert_wire_exact(up, step)
            assert step.metadata["framework"] == "langchain"
            assert step.metadata["node"] == step.metadata["node_path"] == traj.name
            assert step.metadata["run_id"] and step.metadata["parent_run_id"]
    assert episode.trajectory("agent").steps[0].tool_calls  # the tool call went through the graph


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "sync_stream"])
@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
def test_two_node_graph_with_tool(fake_upstream: FakeUpstream, direct: bool, stream: bool) -> None:
    episode = sync_graph.run({"id": "t1", "instruction": "hello graph"}, base_url=fake_upstream.base_url,
                             direct=direct, stream=stream)
    check_episode(fake_upstream, episode)
    assert all(r.get("logprobs") and r.get("return_token_ids") for r in fake_upstream.requests)
    assert all(bool(r.get("stream")) == stream for r in fake_upstream.requests)


@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
async def test_two_node_graph_streaming_async(fake_upstream: FakeUpstream, direct: bool) -> None:
    episode = await streaming_graph.arun({"id": "t1", "instruction": "hello stream"},
                                         base_url=fake_upstream.base_url, direct=direct)
    check_episode(fake_upstream, episode)
    assert all(r.get("stream") for r in fake_upstream.requests)


async def test_eight_episodes_at_once_in_asyncio(fake_upstream: FakeUpstream) -> None:
    tasks = [{"id": f"t{i}", "instruction": f"task number {i}"} for i in range(8)]
    runs = [streaming_graph, sync_graph] * 4
    episodes = await asyncio.gather(*(
        r.arun(t, base_url=fake_upstream.base_url, direct=i % 4 < 2)
        for i, (r, t) in enumerate(zip(runs, tasks, strict=True))
    ))
    for i, ep in enumerate(episodes):
        check_episode(fake_upstream, ep)
        text = episode_text(ep)
        assert f"task number {i}" in text
        assert all(f"task number {j}" not in text for j in range(8) if j != i)


@pytest.mark.slow
def test_eight_episodes_at_once_in_threads(fake_upstream: FakeUpstream) -> None:
    def one(i: int) -> rllm.Episode:
        return sync_graph.run({"id": f"t{i}", "instruction": f"thread task {i}"}, base_url=fake_upstream.base_url,
                              direct=i % 2 == 0)

    with ThreadPoolExecutor(8) as pool:
        episodes = list(pool.map(one, range(8)))
    for i, ep in enumerate(episodes):
        check_episode(fake_upstream, ep)
        assert all(f"thread task {j}" not in episode_text(ep) for j in range(8) if j != i)


def test_one_shared_graph_eight_episodes_in_threads_and_asyncio(fake_upstream: FakeUpstream) -> None:
    """The same compiled graph and the same handler, shared by concurrent episodes (by context, not URL)."""
    graph = wrap_graph(build_graph(fake_upstream.base_url, streaming=True, async_agent=False))

    @rllm.rollout
    def shared(task: rllm.Task, config: rllm.RolloutConfig) -> str:
        out = graph.invoke({"messages": [HumanMessage(str(task.instruction))]})
        return str(out["messages"][-1].content)

    @rllm.rollout
    async def shared_async(task: rllm.Task, config: rllm.RolloutConfig) -> str:
        out = await graph.ainvoke({"messages": [HumanMessage(str(task.instruction))]})
        return str(out["messages"][-1].content)

    async def both() -> list[rllm.Episode]:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(4) as pool:
            threaded = [loop.run_in_executor(pool, lambda i=i: shared.run(
                {"id": f"s{i}", "instruction": f"shared task {i}"}, base_url=fake_upstream.base_url))
                for i in range(4)]
            in_loop = [shared_async.arun({"id": f"s{i}", "instruction": f"shared task {i}"},
                                         base_url=fake_upstream.base_url) for i in range(4, 8)]
            return list(await asyncio.gather(*threaded, *in_loop))

    episodes = asyncio.run(both())
    for i, ep in enumerate(episodes):
        check_episode(fake_upstream, ep)
        assert all(f"shared task {j}" not in episode_text(ep) for j in range(8) if j != i)


def test_zero_line_install_captures_an_unedited_graph(fake_upstream: FakeUpstream) -> None:
    @rllm.rollout
    def untouched(task: rllm.Task, config: rllm.RolloutConfig) -> str:
        out = build_graph(config.base_url).invoke({"messages": [HumanMessage("no callbacks here")]})
        return str(out["messages"][-1].content)

    @rllm.rollout
    def both(task: rllm.Task, config: rllm.RolloutConfig) -> str:  # global + explicit handler: logged once
        handler = RLLMCallbackHandler()
        build_graph(config.base_url).invoke({"messages": [HumanMessage("both")]}, config={"callbacks": [handler]})
        return str(len(handler.calls))

    handler = install()
    try:
        episode = untouched.run({"id": "z"}, base_url=fake_upstream.base_url)
        check_episode(fake_upstream, episode)
        assert install() is handler
        logged_by_global = len(handler.calls)
        episode = both.run({"id": "z2"}, base_url=fake_upstream.base_url)
        check_episode(fake_upstream, episode)
        assert episode.artifacts["answer"] == "3" and len(handler.calls) == logged_by_global  # explicit one wins
    finally:
        uninstall()
    episode = untouched.run({"id": "z3"}, base_url=fake_upstream.base_url)
    assert trajectory_shape(episode) == [("untouched", 3)]  # uninstalled: captured, but no node names


def test_outside_rollout_records_an_adhoc_episode_and_warns_once(fake_upstream: FakeUpstream) -> None:
    handler = RLLMCallbackHandler()
    graph = build_graph(fake_upstream.base_url)
    with pytest.warns(AdapterWarning, match="outside an @rllm.rollout"):
        graph.invoke({"messages": [HumanMessage("adhoc one")]}, config={"callbacks": [handler]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", AdapterWarning)
        graph.invoke({"messages": [HumanMessage("adhoc two")]}, config={"callbacks": [handler]})
        llm = ChatOpenAI(model="fake", base_url=fake_upstream.base_url, api_key="EMPTY")
        solo = RLLMCallbackHandler(agent="solo")
        llm.invoke("direct call", config={"callbacks": [solo]})
    assert [trajectory_shape(ep) for ep in solo.adhoc_episodes] == [[("solo", 1)]]
    assert len(handler.adhoc_episodes) == 2
    for ep, words in zip(handler.adhoc_episodes, ["adhoc one", "adhoc two"], strict=True):
        assert trajectory_shape(ep) == SHAPE
        assert words in episode_text(ep)
        for step in ep.steps:
            assert_wire_exact(fake_upstream, step)
            assert step.metadata["run_id"]


def test_handler_naming_rules(fake_upstream: FakeUpstream) -> None:
    @rllm.rollout
    def named(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        graph = build_graph(config.base_url)
        graph.invoke({"messages": [HumanMessage("x")]}, config={"callbacks": [RLLMCallbackHandler(agent="solver")]})
        with rllm.agent_scope("outer"):
            graph.invoke({"messages": [HumanMessage("y")]}, config={"callbacks": [RLLMCallbackHandler()]})
        graph.invoke({"messages": [HumanMessage("z")]}, config={"callbacks": [RLLMCallbackHandler(split_by="none")]})
        # what langchain's create_agent(name=...) sets: a named agent wins over its graph's node names
        agent_graph = graph.with_config(metadata={"lc_agent_name": "researcher"})
        agent_graph.invoke({"messages": [HumanMessage("w")]}, config={"callbacks": [RLLMCallbackHandler()]})
        agent_graph.invoke({"messages": [HumanMessage("v")]},
                           config={"callbacks": [RLLMCallbackHandler(split_by="agent")]})
        graph.invoke({"messages": [HumanMessage("u")]}, config={"callbacks": [RLLMCallbackHandler(split_by="agent")]})

    episode = named.run({"id": "n"}, base_url=fake_upstream.base_url)
    assert trajectory_shape(episode) == [("solver", 3), ("outer", 3), ("named", 6), ("researcher", 6)]
    assert [s.metadata["node"] for s in episode.trajectory("researcher").steps] == ["planner", "agent", "agent"] * 2
    assert episode.trajectory("researcher").steps[0].metadata["lc_agent_name"] == "researcher"
    with pytest.raises(ValueError, match="split_by"):
        RLLMCallbackHandler(split_by="graph")  # type: ignore[arg-type]
    copy = pickle.loads(pickle.dumps(RLLMCallbackHandler(agent="solver", split_by="agent")))  # shipped to Ray
    assert (copy.agent, copy.split_by, copy.enabled, list(copy.calls)) == ("solver", "agent", True, [])
    with pytest.raises(TypeError, match="with_config"):
        wrap_graph(object())


def test_subgraph_agents_with_the_same_node_names_stay_apart(fake_upstream: FakeUpstream) -> None:
    """Multi-agent graphs nest one agent graph per node (each with a model node "agent"): name by node path."""

    @rllm.rollout
    def team(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        top = StateGraph(State)
        top.add_node("researcher", build_graph(config.base_url))
        top.add_node("writer", build_graph(config.base_url))
        top.add_edge(START, "researcher")
        top.add_edge("researcher", "writer")
        top.compile().invoke({"messages": [HumanMessage("nested")]}, config={"callbacks": [RLLMCallbackHandler()]})

    episode = team.run({"id": "sub"}, base_url=fake_upstream.base_url)
    # the writer sees the researcher's tool result in the shared messages, so the fake upstream answers at once
    assert trajectory_shape(episode) == [("researcher/planner", 1), ("researcher/agent", 2),
                                         ("writer/planner", 1), ("writer/agent", 1)]
    for traj in episode.trajectories:
        for step in traj.steps:
            assert_wire_exact(fake_upstream, step)
            assert step.metadata["node_path"] == traj.name and traj.name.endswith("/" + step.metadata["node"])


@pytest.mark.slow
def test_env_switch_installs_the_global_handler_when_plugins_load() -> None:
    code = ("from importlib.metadata import entry_points\n"  # what the plugin manager does, for this plugin only
            "[ep.load() for ep in entry_points(group='rllm') if ep.name == 'langchain']\n"
            "from rllm_adapters.langchain import installed_handler\n"
            "print(installed_handler() is not None)")
    for value, expected in (("1", "True"), ("", "False")):
        env = {**os.environ, "RLLM_LANGCHAIN_AUTO": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == expected, out.stderr


def test_overhead_benchmark_runs_and_reports_the_ratio() -> None:
    """`benchmarks/adapter_overhead.py` in miniature: it checks every run's capture and names itself."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import adapter_overhead
    finally:
        sys.path.pop(0)
    res = adapter_overhead.measure(runs=4, streaming=False)
    assert res["runs"] == 4 and res["calls_per_run"] == 3
    for key in ("added_paired_ms_per_call", "ratio_paired", "added_cpu_ms_per_call", "ratio_median_wall_ms_per_call"):
        assert math.isfinite(res[key])
    assert res["with"]["median_wall_ms_per_call"] > 0 and res["without"]["median_wall_ms_per_call"] > 0
