"""The agent name a LangChain call sets must not outlive the call: an async chat model reports its end from a task
of its own, where the name cannot be unset, and later calls of the same context were attributed to it."""

from __future__ import annotations

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

import rllm
from rllm_adapters.langchain import RLLMCallbackHandler
from rllm_core.context import CallAgentName, agent_scope, current_agent
from rllm_testing.fake_upstream import FakeUpstream


@rllm.rollout
async def named_then_plain(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    llm = ChatOpenAI(model="fake", base_url=config.base_url, api_key=config.api_key, max_retries=0)
    handler = RLLMCallbackHandler(agent="writer")
    await llm.ainvoke([HumanMessage("first")], config={"callbacks": [handler]})
    plain = AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    await plain.chat.completions.create(model="fake", messages=[{"role": "user", "content": "after"}])
    with agent_scope("checker"):
        await llm.ainvoke([HumanMessage("scoped")], config={"callbacks": [handler]})
        await plain.chat.completions.create(model="fake", messages=[{"role": "user", "content": "scoped plain"}])
    await plain.close()
    return "done"


async def test_a_finished_async_call_leaves_no_agent_name_behind(fake_upstream: FakeUpstream) -> None:
    episode = await named_then_plain.arun({"id": "n1", "instruction": "x"}, base_url=fake_upstream.base_url)
    assert episode.error is None, episode.error
    assert [s.agent for s in episode.steps] == ["writer", None, "writer", "checker"]


def test_an_ended_call_name_is_looked_past_from_any_context() -> None:
    with agent_scope("outer"):
        name = CallAgentName.covering("call", previous=current_agent())
        with agent_scope(name):
            assert current_agent() == "call"
            name.end()  # as a handler does from the context the call ended in
            assert current_agent() == "outer"
    assert current_agent() is None
