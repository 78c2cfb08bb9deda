"""A LangGraph agent that answers, is told when it is wrong, and tries again: a multi-turn task a 135M model learns
on a CPU, which `rllm train` trains as it is.

An ordinary LangGraph graph of two nodes: `solver` (langchain-openai's ChatOpenAI: reply to the conversation) and
`checker` (the environment: compares the last number in the reply with the task's expected value and, when it is
wrong, appends "That is not right. Try again." as a HumanMessage), looping until the answer is right or
`MAX_TRIES` replies were made. Nothing in the graph knows about rllm; the only rllm lines are in the rollout
function `agent` at the bottom: ChatOpenAI pointed at the episode's gateway session (`config.base_url`), the run's
sampling settings with a seed per call, `RLLMCallbackHandler` (the calls' trajectory is named after the node:
"solver"). The benchmark grades the final answer, so an episode earns its reward when any try was right.

    rllm eval arithmetic --agent examples/agents/langgraph_retry.py:agent --max-examples 50
    rllm train arithmetic --agent examples/agents/langgraph_retry.py:agent --max-steps 40

The conversation only grows (question, answer, feedback, answer, ...), so with rllm's policy server the gateway
continues each try from the previous one's exact tokens and the whole episode packs into one training row with
the checker's feedback masked out. Why this task and not FrozenLake for a first curve: SmolLM2-135M sampled at
temperature 1 reached the goal in 0 of 24 FrozenLake 4x4 episodes (it mostly answers LEFT or UP, which do nothing
from the start square), so RL has nothing to reinforce at first; here its first try is right about one time in
five and three tries about one in two, which is a learning signal from the first step.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import rllm  # used by `agent` only: the graph above it is plain LangGraph
from rllm_adapters.langgraph import RLLMCallbackHandler

MAX_TRIES = 3
FEEDBACK = "That is not right. Try again: answer with just the number."
_NUMBER = re.compile(r"-?\d+")


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    tries: int
    solved: bool


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text or "")
    return found[-1] if found else None


def build_graph(llm: ChatOpenAI, expected: str, max_tries: int = MAX_TRIES,
                seed_for: Callable[[int], int | None] | None = None) -> Any:
    """solver -> checker -> solver ... until the reply is right or `max_tries` replies were made."""

    def solver(state: State) -> dict[str, Any]:
        seed = seed_for(state["tries"]) if seed_for is not None else None
        reply = llm.invoke(state["messages"], **({"seed": seed} if seed is not None else {}))
        return {"messages": [reply], "tries": state["tries"] + 1}

    def checker(state: State) -> dict[str, Any]:
        solved = last_number(str(state["messages"][-1].content)) == expected
        if solved or state["tries"] >= max_tries:
            return {"solved": solved}
        return {"solved": False, "messages": [HumanMessage(FEEDBACK)]}

    def again(state: State) -> str:
        return END if state["solved"] or state["tries"] >= max_tries else "solver"

    graph = StateGraph(State)
    graph.add_node("solver", solver)
    graph.add_node("checker", checker)
    graph.add_edge(START, "solver")
    graph.add_edge("solver", "checker")
    graph.add_conditional_edges("checker", again, {"solver": "solver", END: END})
    return graph.compile()


@rllm.rollout(name="langgraph_retry")
def agent(task: rllm.Task, config: rllm.RolloutConfig) -> dict[str, Any]:
    sampling = config.sampling
    llm = ChatOpenAI(base_url=config.base_url, api_key="EMPTY", model=config.model, max_retries=0,
                     temperature=sampling.get("temperature"), max_tokens=sampling.get("max_tokens"),
                     top_p=sampling.get("top_p"))
    start: State = {"messages": [HumanMessage(str(task.instruction))], "tries": 0, "solved": False}
    out = build_graph(llm, str(task.ground_truth), seed_for=config.call_seed).invoke(
        start, config={"callbacks": [RLLMCallbackHandler()], "recursion_limit": 4 * MAX_TRIES + 4})
    replies = [m for m in out["messages"] if isinstance(m, AIMessage)]
    return {"answer": str(replies[-1].content) if replies else "", "tries": out["tries"], "solved": out["solved"]}
