"""Token-exact multi-turn prompts: the gateway hands rllm's policy server the previous turn's own tokens, so a
3-turn agent sampled at temperature 1 packs into one train row per trajectory (without it, re-tokenizing the
history splits most of them); a history the agent changed is never continued."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

import pytest
from openai import AsyncOpenAI

from rllm_core.types import Step, Task
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_rollout.gateway.turns import TurnTracker
from rllm_rollout.rollout import rollout
from rllm_train.packing import pack_trajectory

langchain_core = pytest.importorskip("langchain_core")
from langchain_core.messages import AnyMessage  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402


class ChatState(TypedDict):
    """A LangGraph chat state (module level: LangGraph resolves its annotations from the module)."""

    messages: Annotated[list[AnyMessage], add_messages]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from rllm_serve.models import load_tokenizer

    return load_tokenizer("tiny-random")


def _render(tokenizer: Any) -> Any:
    def render(messages: Any, gen: bool) -> list[int]:
        text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=gen)
        return list(tokenizer.encode(text, add_special_tokens=False))

    return render


def test_continued_prompt_keeps_the_sampled_tokens_and_adds_the_template(tokenizer: Any) -> None:
    from rllm_serve.continuation import ContinueHint, continued_prompt

    render, eot = _render(tokenizer), frozenset({tokenizer.convert_tokens_to_ids("<|im_end|>")})
    first = [{"role": "user", "content": "Say hello"}]
    prompt = render(first, True)
    canonical = list(tokenizer.encode("Hello there", add_special_tokens=False))
    odd = [t for ch in "Hello there" for t in tokenizer.encode(ch, add_special_tokens=False)]  # one token a char
    assert odd != canonical
    history = [*first, {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "Again"}]
    new_turn = render(history, True)[len(render(history[:2], False)):]  # the template tokens of "Again"
    eot_id = next(iter(eot))
    for reply, ended in ((canonical, True), (odd, True), (canonical, False)):
        sampled = prompt + reply + ([eot_id] if ended else [])
        got = continued_prompt(ContinueHint(token_ids=sampled, messages=2), history, render, eot)
        assert got is not None and got[: len(sampled)] == sampled  # exactly what was sampled, then the template
        assert got[len(got) - len(new_turn):] == new_turn
        if not ended:  # cut by max_tokens: the template's end-of-turn comes next, as an observation token
            assert got[len(sampled)] == eot_id
    # the canonical reply that ended on <|im_end|> reproduces the plain render exactly
    sampled = prompt + canonical + [eot_id]
    assert continued_prompt(ContinueHint(token_ids=sampled, messages=2), history, render, eot) == render(history, True)
    # the first k messages must render as a prefix of all of them, else: no exact prompt (the plain render is used)
    assert continued_prompt(ContinueHint(token_ids=prompt, messages=3), history, render, eot) is None


def _step(messages: list[dict[str, Any]], text: str, prompt: list[int], completion: list[int]) -> Step:
    return Step(messages=messages, text=text, prompt_token_ids=prompt, completion_token_ids=completion,
                logprobs=[-0.1] * len(completion), token_source="server")


def test_tracker_hints_only_for_an_unchanged_history() -> None:
    tracker = TurnTracker()
    first = [{"role": "user", "content": "q"}]
    tracker.record("s", [_step(first, "  answer\n", [1, 2], [3, 4])])
    follow = [*first, {"role": "assistant", "content": "answer"}, {"role": "user", "content": "more"}]
    assert tracker.hint("s", {"messages": follow}) == {"token_ids": [1, 2, 3, 4], "messages": 2}
    changed = [*first, {"role": "assistant", "content": "a summary"}, {"role": "user", "content": "more"}]
    assert tracker.hint("s", {"messages": changed}) is None
    assert tracker.hint("s", {"messages": follow, "n": 2}) is None
    assert tracker.hint("other", {"messages": follow}) is None
    tracker.forget("s")
    assert tracker.hint("s", {"messages": follow}) is None


@rollout
async def three_turns(task: Task, config: Any) -> str:
    client = AsyncOpenAI(base_url=config.base_url, api_key=config.api_key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.instruction}]
    text = ""
    for turn in range(3):
        reply = await client.chat.completions.create(model=config.model, messages=messages,  # type: ignore[arg-type]
                                                     temperature=1.0, max_tokens=6, seed=turn)
        text = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text.strip()}, {"role": "user", "content": f"go on {turn}"}]
    return text


@pytest.mark.slow
def test_multi_turn_agent_packs_into_one_row_per_trajectory() -> None:
    from rllm_rollout.engine import run_episodes
    from rllm_serve import start_policy_server

    server = start_policy_server("tiny-random")
    rates = {}
    try:
        for exact in (False, True):
            gateway = start_gateway([UpstreamConfig(url=server.base_url, inject_token_ids=True, exact_turns=exact)])
            try:
                tasks = [Task(id=f"t{i}", instruction=f"Tell me about {i}") for i in range(8)]
                episodes = asyncio.run(run_episodes(three_turns, tasks, gateway=gateway, model=server.model_name,
                                                    concurrency=8, progress=False))
            finally:
                gateway.stop()
            assert all(e.error is None and len(e.steps) == 3 for e in episodes), [e.error for e in episodes]
            single = sum(len(pack_trajectory(e.trajectories[0], 1.0)[0]) == 1 for e in episodes)
            rates[exact] = single / len(episodes)
    finally:
        server.stop()
    print(f"one row per trajectory: re-tokenized {rates[False]:.0%}, exact turns {rates[True]:.0%}")
    assert rates[True] == 1.0
    assert rates[False] < 1.0  # without the hint, random BPE at temperature 1 does not survive re-tokenization


def test_a_high_split_rate_is_said_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import rllm_train.loop as loop

    monkeypatch.setattr(loop, "_warned_split", False)
    with caplog.at_level("WARNING", logger="rllm.train"):
        loop._warn_if_turns_split({"pack/steps_used": 100.0, "pack/rows_split": 2.0})  # 2 %: fine
        loop._warn_if_turns_split({"pack/steps_used": 100.0, "pack/rows_split": 30.0})
        loop._warn_if_turns_split({"pack/steps_used": 100.0, "pack/rows_split": 40.0})
    said = [r.getMessage() for r in caplog.records if "started a new train row" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("30 of 100 LLM calls")


@pytest.mark.slow
@pytest.mark.parametrize("exact", [True, False])
def test_langgraph_agent_turns_pack_into_one_row_on_rllm_policy_server(exact: bool) -> None:
    """A LangGraph chat loop (ChatOpenAI, history in the graph state) against rllm's policy server at temperature 1:
    its calls re-tokenize differently than they were sampled, and exact turns still give one row per trajectory."""
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    from rllm_adapters.langgraph import RLLMCallbackHandler
    from rllm_rollout.engine import run_episodes
    from rllm_serve import start_policy_server

    @rollout
    def chat_loop(task: Task, config: Any) -> str:
        # seeded: the server samples the same tokens whatever the batching, so whether re-tokenization splits a
        # trajectory is fixed by the test, not by chance (unseeded, a run could sample only canonical tokens)
        llm = ChatOpenAI(base_url=config.base_url, api_key=config.api_key, model=config.model, temperature=1.0,
                         max_tokens=12, seed=int(task.id[1:]) + 1000)

        def talk(state: ChatState) -> dict[str, Any]:
            reply = llm.invoke(state["messages"])
            return {"messages": [reply, HumanMessage(f"go on ({len(state['messages'])})")]}

        graph = StateGraph(ChatState)
        graph.add_node("talk", talk)  # one node looping: its calls are one trajectory, as an agent node's are
        graph.add_edge(START, "talk")
        graph.add_conditional_edges("talk", lambda state: "talk" if len(state["messages"]) < 7 else END)
        out = graph.compile().invoke({"messages": [HumanMessage(task.instruction)]},
                                     config={"callbacks": [RLLMCallbackHandler()]})
        return str(out["messages"][-2].content)

    server = start_policy_server("tiny-random")
    try:
        upstream = server.upstream_config()  # exact turns on: the default for rllm's policy server
        gateway = start_gateway([upstream if exact else upstream.model_copy(update={"exact_turns": False})])
        try:
            tasks = [Task(id=f"g{i}", instruction=f"Tell me a story about {i}") for i in range(6)]
            episodes = asyncio.run(run_episodes(chat_loop, tasks, gateway=gateway, model=server.model_name,
                                                concurrency=6, progress=False))
        finally:
            gateway.stop()
    finally:
        server.stop()
    assert all(e.error is None and len(e.steps) == 3 for e in episodes), [e.error for e in episodes]
    assert all(len(e.trajectories) == 1 for e in episodes)
    rows = [len(pack_trajectory(e.trajectories[0], 1.0)[0]) for e in episodes]
    if exact:
        assert rows == [1] * len(episodes), rows
    else:  # re-tokenized at temperature 1: these seeds split 4 of 6 trajectories (the bug exact turns fix)
        assert sum(rows) > len(episodes), rows
