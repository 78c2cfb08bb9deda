"""A LangGraph search agent, which `rllm eval` / `rllm train` run as it is.

The graph LangGraph's docs teach for tool use: a `model` node (langchain-openai's ChatOpenAI with the tools bound)
and a prebuilt `ToolNode`, joined by `tools_condition` (tool calls go to the tools, a reply without one ends the
run). The tools are ordinary `@tool` functions over a search backend. Nothing in the graph knows about rllm; the
rllm lines are in `agent` at the bottom: ChatOpenAI points at the episode's session URL (`config.base_url`, every
call recorded), `RLLMCallbackHandler` names the trajectory after the node, and the backend is the task's corpus
(or the retrieval server named by RLLM_RETRIEVER_URL) through `rllm_envs.search`.

    rllm eval hotpotqa --agent examples/agents/langgraph_search.py:agent -n 20
    rllm train hotpotqa --agent examples/agents/langgraph_search.py:agent --max-steps 40
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr

import rllm  # used by `agent` only: the graph above it is plain LangGraph

SYSTEM = ("Answer the question by searching Wikipedia. Call search with a few keywords for one fact at a time and "
          "open to read a passage. When you know the answer, reply without a tool call and end with one line: "
          "'FINAL ANSWER: <short answer>'.")


class Backend(Protocol):
    def call(self, name: str, arguments: dict[str, Any]) -> str: ...


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def make_tools(backend: Backend) -> list[BaseTool]:
    @tool
    def search(query: str, k: int = 5) -> str:
        """Search Wikipedia passages; returns ids, titles and the start of each passage."""
        return backend.call("search", {"query": query, "k": k})

    @tool("open")
    def open_passage(doc_id: str) -> str:
        """Read a whole passage by the id a search returned."""
        return backend.call("open", {"doc_id": doc_id})

    return [search, open_passage]


def build_graph(llm: ChatOpenAI, tools: list[BaseTool]) -> Any:
    model = llm.bind_tools(tools)

    def call_model(state: State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def ask(llm: ChatOpenAI, backend: Backend, question: str, max_turns: int = 6,
        callbacks: list[Any] | None = None) -> tuple[str, int]:
    """(the last reply, the number of model calls)."""
    out = build_graph(llm, make_tools(backend)).invoke(
        {"messages": [SystemMessage(SYSTEM), HumanMessage(question)]},
        config={"callbacks": callbacks or [], "recursion_limit": 2 * max_turns})
    replies = [m for m in out["messages"] if isinstance(m, AIMessage)]
    return (str(replies[-1].content) if replies else ""), len(replies)


@rllm.rollout(name="langgraph_search")
def agent(task: rllm.Task, config: rllm.RolloutConfig) -> dict[str, Any]:
    from langgraph.errors import GraphRecursionError

    from rllm_adapters.langgraph import RLLMCallbackHandler
    from rllm_envs.search.agent import passage_source
    from rllm_envs.search.tools import SearchTools

    tools = SearchTools(passage_source(task))
    sampling = config.sampling
    llm = ChatOpenAI(base_url=config.base_url, api_key=SecretStr("EMPTY"), model=config.model, max_retries=0,
                     temperature=sampling.get("temperature"), max_completion_tokens=sampling.get("max_tokens"),
                     top_p=sampling.get("top_p"))
    try:
        text, turns = ask(llm, tools, str(task.metadata.get("question") or task.instruction),
                          int(task.metadata.get("max_turns", 6)), callbacks=[RLLMCallbackHandler()])
        stopped = "answer"
    except GraphRecursionError:  # out of turns while still calling tools
        text, turns, stopped = "", int(task.metadata.get("max_turns", 6)), "max_turns"
    return {"answer": text, "turns": turns, "stopped": stopped,
            "retrieved_ids": list(dict.fromkeys(tools.retrieved_ids)),
            "opened_ids": list(dict.fromkeys(tools.opened_ids)), "tool_log": tools.log.records()}
