"""AutoGen adapter (autogen-agentchat / autogen-ext 0.7) against the fake upstream, with real teams.

RoundRobinGroupChat of solver + critic, ended after 4 agent messages: trajectories [solver, critic] with two
steps each, calls alternating. Streaming (`model_client_stream=True`, where autogen-ext drops logprobs)
and not; through the gateway session URL and straight to the upstream (in-process capture).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent, SocietyOfMindAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat
from autogen_core import SingleThreadedAgentRuntime
from autogen_ext.models.openai import OpenAIChatCompletionClient
from autogen_ext.models.replay import ReplayChatCompletionClient
from test_adapter_support import (
    assert_wire_exact,
    episode_text,
    fresh_warnings,  # noqa: F401  (autouse: once-only warnings fire again per test)
    trajectory_shape,
)

import rllm
from rllm_adapters.autogen import NamedModelClient, adhoc_episodes, named_clients, wrap_team
from rllm_testing.fake_upstream import FakeUpstream, default_responder, start_fake_upstream

INFO: Any = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
             "structured_output": False}


def client(url: str, api_key: str = "EMPTY") -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(model="fake", base_url=url, api_key=api_key, model_info=INFO, max_retries=0)


def session_client(config: rllm.RolloutConfig) -> OpenAIChatCompletionClient:
    """A client for the episode's gateway session, with the token the gateway expects."""
    return client(config.base_url, config.api_key)


def endpoint(config: rllm.RolloutConfig) -> str:
    return str(config.upstream_url) if getattr(config, "direct", False) else config.base_url


def round_robin(url: str, stream: bool, runtime: Any = None, api_key: str = "EMPTY") -> RoundRobinGroupChat:
    solver = AssistantAgent("solver", model_client=client(url, api_key), model_client_stream=stream)
    critic = AssistantAgent("critic", model_client=client(url, api_key), model_client_stream=stream)
    return RoundRobinGroupChat([solver, critic], termination_condition=MaxMessageTermination(5), runtime=runtime)


@rllm.rollout
async def team_rollout(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    team = wrap_team(round_robin(endpoint(config), stream=bool(getattr(config, "stream", False)),
                                 api_key=config.api_key))
    result = await team.run(task=str(task.instruction))
    return str(result.messages[-1].to_text())


def check_round_robin(up: FakeUpstream, episode: rllm.Episode) -> None:
    assert episode.termination_reason == "completed", episode.error
    assert trajectory_shape(episode) == [("solver", 2), ("critic", 2)]
    assert [s.agent for s in episode.steps] == ["solver", "critic", "solver", "critic"]
    for step in episode.steps:
        assert_wire_exact(up, step)
        assert step.metadata["framework"] == "autogen" and step.metadata["team"] == "RoundRobinGroupChat"


@pytest.mark.parametrize("stream", [False, True], ids=["create", "create_stream"])
@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
async def test_round_robin_one_trajectory_per_agent(fake_upstream: FakeUpstream, stream: bool, direct: bool) -> None:
    episode = await team_rollout.arun({"id": "rr", "instruction": "solve it"}, base_url=fake_upstream.base_url,
                                      stream=stream, direct=direct)
    check_round_robin(fake_upstream, episode)
    assert all(bool(r.get("stream")) == stream for r in fake_upstream.requests)


def selector_responder(body: dict[str, Any]) -> Any:
    """Answer the selector's prompt with the first candidate role; everything else as usual."""
    for m in body.get("messages") or []:
        found = re.search(r"select the next role from \[([^\]]*)\]", str(m.get("content")))
        if found:
            return found.group(1).split(",")[0].strip().strip("'\"")
    return default_responder(body)


@pytest.fixture
def selector_upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(responder=selector_responder) as up:
        yield up


async def test_selector_group_chat_names_the_selector(selector_upstream: FakeUpstream) -> None:
    @rllm.rollout
    async def selector(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        agents = [AssistantAgent(n, model_client=session_client(config)) for n in ("solver", "critic")]
        team = wrap_team(SelectorGroupChat(agents, model_client=session_client(config),
                                           termination_condition=MaxMessageTermination(4)), manager_name="picker")
        assert set(named_clients(team)) == {"picker", "solver", "critic"}
        await team.run(task="pick someone")

    episode = await selector.arun({"id": "sel"}, base_url=selector_upstream.base_url)
    assert episode.termination_reason == "completed", episode.error
    names = [s.agent for s in episode.steps]
    assert names[:2] == ["picker", "solver"] and "critic" in names
    assert {t.name for t in episode.trajectories} == {"picker", "solver", "critic"}
    for step in episode.steps:
        assert_wire_exact(selector_upstream, step)


async def test_nested_team_in_a_society_of_mind_agent(fake_upstream: FakeUpstream) -> None:
    @rllm.rollout
    async def society(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        members = [AssistantAgent(n, model_client=session_client(config)) for n in ("solver", "critic")]
        inner = RoundRobinGroupChat(members, termination_condition=MaxMessageTermination(3))
        agent = wrap_team(SocietyOfMindAgent("society", team=inner, model_client=session_client(config)))
        assert set(named_clients(agent)) == {"society", "solver", "critic"}
        await agent.run(task="think together")

    episode = await society.arun({"id": "som"}, base_url=fake_upstream.base_url)
    assert episode.termination_reason == "completed", episode.error
    assert trajectory_shape(episode) == [("solver", 1), ("critic", 1), ("society", 1)]
    for step in episode.steps:
        assert_wire_exact(fake_upstream, step)


def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


async def test_single_assistant_agent_with_tool(fake_upstream: FakeUpstream) -> None:
    @rllm.rollout
    async def single(task: rllm.Task, config: rllm.RolloutConfig) -> str:
        agent = wrap_team(AssistantAgent("helper", model_client=session_client(config), tools=[add_one],
                                         reflect_on_tool_use=True))
        result = await agent.run(task="use the tool")
        return str(result.messages[-1].to_text())

    episode = await single.arun({"id": "one"}, base_url=fake_upstream.base_url)
    assert episode.termination_reason == "completed", episode.error
    assert trajectory_shape(episode) == [("helper", 2)]
    assert episode.steps[0].tool_calls and episode.steps[0].tool_calls[0]["function"]["name"] == "add_one"
    for step in episode.steps:
        assert_wire_exact(fake_upstream, step)


async def test_runtime_started_outside_the_episode(fake_upstream: FakeUpstream) -> None:
    """The trap: agents run in the context of a runtime started elsewhere; wrap_team binds the episode."""
    runtime = SingleThreadedAgentRuntime()
    runtime.start()  # outside any episode: its tasks carry no episode context

    @rllm.rollout
    async def on_shared_runtime(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        team = round_robin(str(config.upstream_url), stream=False, runtime=runtime)
        if task.metadata.get("wrap"):
            team = wrap_team(team)
        await team.run(task="outside runtime")

    try:
        plain = await on_shared_runtime.arun({"id": "plain"}, base_url=fake_upstream.base_url)
        wrapped = await on_shared_runtime.arun({"id": "w", "metadata": {"wrap": True}}, base_url=fake_upstream.base_url)
    finally:
        await runtime.stop()
    assert plain.steps == []  # without the adapter these calls are lost
    check_round_robin(fake_upstream, wrapped)


async def test_team_built_once_is_repointed_per_episode(fake_upstream: FakeUpstream) -> None:
    """The issue's remedy for the runtime trap: a team built once (for another endpoint, on a runtime started
    outside any episode) gets each episode's own session URL from `wrap_team(team, base_url=...)`."""
    runtime = SingleThreadedAgentRuntime()
    runtime.start()
    team = round_robin("http://127.0.0.1:9/v1", stream=False, runtime=runtime)  # a dead port

    @rllm.rollout
    async def reuse(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        await team.reset()
        wrap_team(team, base_url=config.base_url, api_key=config.api_key)
        assert {str(c.inner.dump_component().config["base_url"]) for c in named_clients(team).values()} == {
            config.base_url}
        await team.run(task=str(task.instruction))

    try:
        episodes = [await reuse.arun({"id": f"e{i}", "instruction": f"episode {i}"}, base_url=fake_upstream.base_url)
                    for i in range(2)]
    finally:
        await runtime.stop()
    for i, episode in enumerate(episodes):
        check_round_robin(fake_upstream, episode)
        assert f"episode {i}" in episode_text(episode) and f"episode {1 - i}" not in episode_text(episode)
    with pytest.raises(TypeError, match="only re-points"):
        wrap_team(AssistantAgent("replay", model_client=ReplayChatCompletionClient(["hi"])), base_url="http://x/v1")


async def test_eight_teams_at_once_in_asyncio(fake_upstream: FakeUpstream) -> None:
    episodes = await asyncio.gather(*(
        team_rollout.arun({"id": f"t{i}", "instruction": f"team task {i}"}, base_url=fake_upstream.base_url,
                          stream=i % 2 == 0, direct=i % 4 < 2)
        for i in range(8)
    ))
    for i, ep in enumerate(episodes):
        check_round_robin(fake_upstream, ep)
        assert all(f"team task {j}" not in episode_text(ep) for j in range(8) if j != i)


@pytest.mark.slow
def test_eight_teams_at_once_in_threads(fake_upstream: FakeUpstream) -> None:
    def one(i: int) -> rllm.Episode:
        return team_rollout.run({"id": f"t{i}", "instruction": f"thread team {i}"}, base_url=fake_upstream.base_url,
                                stream=i % 2 == 1, direct=i % 2 == 0)

    with ThreadPoolExecutor(8) as pool:
        episodes = list(pool.map(one, range(8)))
    for i, ep in enumerate(episodes):
        check_round_robin(fake_upstream, ep)
        assert all(f"thread team {j}" not in episode_text(ep) for j in range(8) if j != i)


async def test_outside_rollout_records_adhoc_and_rewrap_repoints(fake_upstream: FakeUpstream) -> None:
    team = wrap_team(round_robin("http://127.0.0.1:9/v1", stream=False))  # a dead port, re-pointed below
    assert all(isinstance(c, NamedModelClient) for c in named_clients(team).values())
    assert wrap_team(team, base_url=fake_upstream.base_url) is team
    before = len(adhoc_episodes)
    with pytest.warns(UserWarning, match="outside an @rllm.rollout"):
        await team.run(task="no rollout here")
    assert len(adhoc_episodes) == before + 1
    episode = adhoc_episodes[-1]
    check_round_robin(fake_upstream, episode)
    with pytest.raises(TypeError, match="AutoGen team"):
        wrap_team(object())


# ------------------------------------------------------------------ one SelectorGroupChat, many episodes
SELECTOR_AGENTS = ("solver", "critic", "checker")
"""Three participants: with two, AutoGen skips the selector whenever one candidate is left."""


def selector_team(url: str, runtime: Any = None, selector_client: Any = None) -> SelectorGroupChat:
    agents = [AssistantAgent(n, model_client=client(url)) for n in SELECTOR_AGENTS]
    return SelectorGroupChat(agents, model_client=selector_client or client(url), runtime=runtime,
                             termination_condition=MaxMessageTermination(4))


def check_selector_episode(up: FakeUpstream, episode: rllm.Episode, instruction: str, others: list[str]) -> None:
    """Exactly this episode's calls: three speaker selections, each followed by the chosen agent's turn."""
    assert episode.termination_reason == "completed", episode.error
    names = [s.agent for s in episode.steps]
    assert names[0::2] == ["selector"] * 3 and all(n in SELECTOR_AGENTS for n in names[1::2]), names
    assert {t.name for t in episode.trajectories} == {"selector", *names[1::2]}
    assert instruction in episode_text(episode) and not any(o in episode_text(episode) for o in others)
    for step in episode.steps:
        assert_wire_exact(up, step)
        assert step.metadata["framework"] == "autogen" and step.metadata["team"] == "SelectorGroupChat"


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "no-reset"])
@pytest.mark.parametrize("direct", [False, True], ids=["gateway", "inprocess"])
async def test_selector_team_reused_records_each_episode_in_its_own_session(
        selector_upstream: FakeUpstream, reset: bool, direct: bool) -> None:
    """The review's bug: the selector's client reached AutoGen's group chat manager once (at the first run or
    reset), so a team re-wrapped per episode kept selecting speakers through the first episode's client."""
    runtime = SingleThreadedAgentRuntime()
    runtime.start()  # outside any episode, as a long-lived worker would
    team = selector_team("http://127.0.0.1:9/v1", runtime=runtime)  # a dead port: re-pointed per episode

    @rllm.rollout
    async def reuse(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        if reset:
            await team.reset()  # before wrap_team on the first episode: the manager exists with the raw client
        wrap_team(team, base_url=endpoint(config), api_key=config.api_key)
        await team.run(task=str(task.instruction))

    instructions = [f"selector episode {i}" for i in range(3)]
    try:
        episodes = [await reuse.arun({"id": f"s{i}", "instruction": text}, base_url=selector_upstream.base_url,
                                     direct=direct) for i, text in enumerate(instructions)]
    finally:
        await runtime.stop()
    for i, (ep, text) in enumerate(zip(episodes, instructions, strict=True)):
        # without reset AutoGen carries the conversation on (earlier tasks are in the prompt), never later ones
        others = [o for j, o in enumerate(instructions) if j > i or (reset and j != i)]
        check_selector_episode(selector_upstream, ep, text, others)
    assert sum(len(ep.steps) for ep in episodes) == len(selector_upstream.requests) == 18  # none lost or strayed


async def test_selector_teams_reused_concurrently(selector_upstream: FakeUpstream) -> None:
    """AutoGen refuses to run one team twice at once, so concurrency means two reused teams running side by
    side (one runtime, one selector client object shared by both), each for two episodes in turn."""
    runtime = SingleThreadedAgentRuntime()
    runtime.start()
    shared = client("http://127.0.0.1:9/v1")
    teams = [wrap_team(selector_team("http://127.0.0.1:9/v1", runtime=runtime, selector_client=shared))
             for _ in range(2)]

    @rllm.rollout
    async def reuse(task: rllm.Task, config: rllm.RolloutConfig) -> None:
        team = teams[int(task.metadata["team"])]
        await team.reset()
        wrap_team(team, base_url=config.base_url, api_key=config.api_key)
        await team.run(task=str(task.instruction))

    async def chain(t: int) -> list[rllm.Episode]:
        return [await reuse.arun({"id": f"c{t}{i}", "instruction": f"team {t} round {i}", "metadata": {"team": t}},
                                 base_url=selector_upstream.base_url) for i in range(2)]

    try:
        chains = await asyncio.gather(chain(0), chain(1))
        with pytest.raises(ValueError, match="already running"):  # what "concurrent" cannot mean in AutoGen
            await asyncio.gather(teams[0].run(task="a"), teams[0].run(task="b"))
    finally:
        await runtime.stop()
    texts = [f"team {t} round {i}" for t in range(2) for i in range(2)]
    for t, episodes in enumerate(chains):
        for i, ep in enumerate(episodes):
            check_selector_episode(selector_upstream, ep, texts[2 * t + i], [o for o in texts if o != texts[2 * t + i]])
