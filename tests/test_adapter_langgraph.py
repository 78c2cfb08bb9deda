"""LangGraph / LangChain adapter against the fake upstream: a real two-node graph with a tool call.

Graph: planner (one plain call) -> agent (tool-bound model: calls `add_one`, then answers) -> tools -> agent.
So every episode must hold trajectories [("planner", 1), ("agent", 2)], each step with the server's ids.
"""

from __future__ import annotations

import asyncio
import json
import math
import operator
import os
import pickle
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import StructuredTool, tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send
from pydantic import BaseModel
from test_adapter_support import (
    assert_wire_exact,
    episode_text,
    fresh_warnings,  # noqa: F401  (autouse: once-only warnings fire again per test)
    trajectory_shape,
)

import rllm
from rllm_adapters._common import AdapterWarning
from rllm_adapters.langgraph import RLLMCallbackHandler, install, uninstall, wrap_graph
from rllm_testing.fake_upstream import FakeUpstream, default_responder, start_fake_upstream

SHAPE = [("planner", 1), ("agent", 2)]


@tool
def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(base_url: str, streaming: bool = False, async_agent: bool | None = None,
                api_key: str = "EMPTY") -> Any:
    llm = ChatOpenAI(model="fake", base_url=base_url, api_key=api_key, streaming=streaming, max_retries=0)
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


def session_graph(config: rllm.RolloutConfig) -> Any:
    """The graph on the episode's gateway session, with the token the gateway expects."""
    return build_graph(config.base_url, api_key=config.api_key)


def endpoint(config: rllm.RolloutConfig) -> str:
    """The gateway session URL, or with `direct=True` the upstream itself (in-process capture, by context)."""
    return str(config.upstream_url) if getattr(config, "direct", False) else config.base_url


@rllm.rollout
def sync_graph(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    graph = build_graph(endpoint(config), streaming=bool(getattr(config, "stream", False)), async_agent=False,
                        api_key=config.api_key)
    out = graph.invoke({"messages": [HumanMessage(str(task.instruction))]},
                       config={"callbacks": [RLLMCallbackHandler()]})
    return str(out["messages"][-1].content)


@rllm.rollout
async def streaming_graph(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    """Async + streamed: `astream` with token streaming in both nodes, one node async."""
    graph = wrap_graph(build_graph(endpoint(config), streaming=True, api_key=config.api_key))
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
        out = session_graph(config).invoke({"messages": [HumanMessage("no callbacks here")]})
        return str(out["messages"][-1].content)

    @rllm.rollout
    def both(task: rllm.Task, config: rllm.RolloutConfig) -> str:  # global + explicit handler: logged once
        handler = RLLMCallbackHandler()
        session_graph(config).invoke({"messages": [HumanMessage("both")]}, config={"callbacks": [handler]})
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
        graph = session_graph(config)
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
        top.add_node("researcher", session_graph(config))
        top.add_node("writer", session_graph(config))
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


# ------------------------------------------------------------------------------- Send fan-out, tool calls
TOPICS = ["cats", "dogs", "owls"]


class MapState(TypedDict):
    topics: list[str]
    drafts: Annotated[list[str], operator.add]
    messages: Annotated[list[AnyMessage], add_messages]


def map_reduce_graph(config: rllm.RolloutConfig) -> Any:
    """draft x3 (Send) -> collect (one call) -> research x2 (Send, each a whole tool-calling subgraph)."""
    llm = ChatOpenAI(model="fake", base_url=endpoint(config), api_key=config.api_key, max_retries=0)

    async def draft(branch: dict[str, Any]) -> dict[str, Any]:
        return {"drafts": [(await llm.ainvoke(f"draft about {branch['topic']}")).content]}

    def collect(state: MapState) -> dict[str, Any]:
        return {"messages": [llm.invoke("pick one of: " + "; ".join(sorted(state["drafts"])))]}

    g = StateGraph(MapState)  # draft runs sync under invoke, async under ainvoke
    g.add_node("draft", RunnableLambda(lambda b: {"drafts": [llm.invoke(f"draft about {b['topic']}").content]},
                                       afunc=draft))
    g.add_node("collect", collect)
    g.add_node("research", build_graph(endpoint(config), api_key=config.api_key))
    g.add_conditional_edges(START, lambda s: [Send("draft", {"topic": t}) for t in s["topics"]], ["draft"])
    g.add_edge("draft", "collect")
    g.add_conditional_edges("collect", lambda s: [
        Send("research", {"messages": [HumanMessage(f"research topic {i}")]}) for i in range(2)], ["research"])
    g.add_edge("research", END)
    return g.compile()


@rllm.rollout
async def map_reduce(task: rllm.Task, config: rllm.RolloutConfig) -> None:
    graph = wrap_graph(map_reduce_graph(config))
    inputs = {"topics": TOPICS, "drafts": [], "messages": []}
    if task.metadata.get("sync"):
        await asyncio.to_thread(graph.invoke, inputs)
    else:
        await graph.ainvoke(inputs)


@pytest.mark.parametrize("sync", [False, True], ids=["ainvoke", "invoke"])
@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
async def test_send_fan_out_gives_one_trajectory_per_branch(fake_upstream: FakeUpstream, sync: bool,
                                                           direct: bool) -> None:
    """Each Send branch is its own trajectory, named by its index in the step's Send list ("draft#1"); a
    branch running a subgraph prefixes that subgraph's nodes ("research#1/agent")."""
    episodes = [await map_reduce.arun({"id": f"mr{i}", "metadata": {"sync": sync}},
                                      base_url=fake_upstream.base_url, direct=direct) for i in range(2)]
    expected = {**{f"draft#{i}": 1 for i in range(3)}, "collect": 1,
                **{f"research#{i}/{node}": n for i in range(2) for node, n in (("planner", 1), ("agent", 2))}}
    for episode in episodes:
        assert episode.termination_reason == "completed", episode.error
        assert dict(trajectory_shape(episode)) == expected  # the same names in every episode
        for traj in episode.trajectories:
            text = " ".join(json.dumps(s.messages) for s in traj.steps)
            for step in traj.steps:
                assert step.agent == step.metadata["node_path"] == traj.name
                assert_wire_exact(fake_upstream, step)
            if traj.name.startswith("draft#"):
                i = int(traj.name[len("draft#"):])
                assert traj.steps[0].metadata["send_index"] == i and f"about {TOPICS[i]}" in text
                assert all(f"about {t}" not in text for t in TOPICS if t != TOPICS[i])
            elif traj.name.startswith("research#"):
                i = int(traj.name.split("/")[0][len("research#"):])
                assert f"research topic {i}" in text and f"research topic {1 - i}" not in text
            else:
                assert "send_index" not in traj.steps[0].metadata


def tools_in_turn(body: dict[str, Any]) -> Any:
    """Call the offered tools one after the other (one per turn), then answer."""
    tools = body.get("tools") or []
    done = sum(m.get("role") == "tool" for m in body.get("messages") or [])
    if done < len(tools):
        return {"tool_call": {"name": tools[done]["function"]["name"], "arguments": {"x": done + 1}}}
    return default_responder(body)


def asking_tool(llm: ChatOpenAI, name: str, prompt: str) -> StructuredTool:
    """A tool that asks the model (sync under invoke, async under ainvoke)."""
    async def ask(x: int) -> str:
        return str((await llm.ainvoke(prompt.format(x))).content)

    return StructuredTool.from_function(lambda x: str(llm.invoke(prompt.format(x)).content), coroutine=ask,
                                        name=name, description=f"{name} about x", args_schema=AddOne)


class AddOne(BaseModel):
    x: int


def expert_graph(base_url: str, api_key: str, parallel: bool = False) -> Any:
    """planner -> agent <-> tools, the agent calling ask_expert, ask_critic, add_one in turn; or (`parallel`)
    one node asking for both model-calling tools at once, which ToolNode runs side by side."""
    llm = ChatOpenAI(model="fake", base_url=base_url, api_key=api_key, max_retries=0)
    tools = [asking_tool(llm, "ask_expert", "expert, what is {}?"), asking_tool(llm, "ask_critic", "critic, judge {}"),
             add_one]
    g = StateGraph(State)
    g.add_node("tools", ToolNode(tools))
    if parallel:
        calls = [{"name": "ask_expert", "args": {"x": 7}, "id": "call_e", "type": "tool_call"},
                 {"name": "ask_critic", "args": {"x": 8}, "id": "call_c", "type": "tool_call"}]
        g.add_node("fanout", lambda state: {"messages": [AIMessage("", tool_calls=calls)]})
        g.add_edge(START, "fanout")
        g.add_edge("fanout", "tools")
        g.add_edge("tools", END)
        return g.compile()
    g.add_node("planner", lambda state: {"messages": [llm.invoke(state["messages"])]})
    g.add_node("agent", RunnableLambda(lambda state: state["messages"]) | llm.bind_tools(tools)
               | (lambda message: {"messages": [message]}))
    g.add_edge(START, "planner")
    g.add_edge("planner", "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


@pytest.mark.parametrize("sync", [False, True], ids=["async_tools", "sync_tools"])
@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
async def test_calls_inside_a_tool_are_named_by_the_tool(sync: bool, direct: bool) -> None:
    """A tool that asks a model is its own trajectory, "tools:<tool name>"; ordinary nodes keep their names,
    and a tool that calls no model (add_one) adds nothing."""
    with start_fake_upstream(responder=tools_in_turn) as up:
        @rllm.rollout
        async def experts(task: rllm.Task, config: rllm.RolloutConfig) -> None:
            for parallel in (False, True):
                graph = expert_graph(endpoint(config), config.api_key, parallel)
                inputs = {"messages": [HumanMessage("ask around")]}
                if sync:
                    await asyncio.to_thread(graph.invoke, inputs, {"callbacks": [RLLMCallbackHandler()]})
                else:
                    await graph.ainvoke(inputs, config={"callbacks": [RLLMCallbackHandler()]})

        episode = await experts.arun({"id": "tools"}, base_url=up.base_url, direct=direct)
        assert episode.termination_reason == "completed", episode.error
        assert trajectory_shape(episode) == [("planner", 1), ("agent", 4), ("tools:ask_expert", 2),
                                             ("tools:ask_critic", 2)]
        expert, critic = (" ".join(json.dumps(s.messages) for s in t.steps) for t in episode.trajectories[2:])
        assert "expert, what is 1?" in expert and "expert, what is 7?" in expert and "critic" not in expert
        assert "critic, judge 2" in critic and "critic, judge 8" in critic and "expert" not in critic
        for traj in episode.trajectories:
            for step in traj.steps:
                assert_wire_exact(up, step)
                assert step.metadata["node_path"] == traj.name.split(":")[0]  # the graph's own node path
                if traj.name.startswith("tools:"):
                    assert step.metadata["tool"] == traj.name.split(":")[1] and step.metadata["node"] == "tools"
                else:
                    assert "tool" not in step.metadata


def test_a_subgraph_run_by_a_tool_is_named_under_the_tool(fake_upstream: FakeUpstream) -> None:
    """A tool that runs a whole agent graph: its nodes sit under the tool, "tools:ask_team/agent"."""

    @rllm.rollout
    def delegate(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        team = session_graph(config)

        @tool
        def ask_team(x: int) -> str:
            """Ask the team about x."""
            return str(team.invoke({"messages": [HumanMessage(f"team, look at {x}")]})["messages"][-1].content)

        llm = ChatOpenAI(model="fake", base_url=config.base_url, api_key=config.api_key, max_retries=0)
        g = StateGraph(State)
        g.add_node("agent", lambda state: {"messages": [llm.bind_tools([ask_team]).invoke(state["messages"])]})
        g.add_node("tools", ToolNode([ask_team]))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        g.compile().invoke({"messages": [HumanMessage("delegate")]}, config={"callbacks": [RLLMCallbackHandler()]})

    episode = delegate.run({"id": "delegate"}, base_url=fake_upstream.base_url)
    assert episode.termination_reason == "completed", episode.error
    assert trajectory_shape(episode) == [("agent", 2), ("tools:ask_team/planner", 1), ("tools:ask_team/agent", 2)]
    for traj in episode.trajectories:
        for step in traj.steps:
            assert_wire_exact(fake_upstream, step)
            assert step.metadata.get("tool") == ("ask_team" if traj.name.startswith("tools:") else None)
