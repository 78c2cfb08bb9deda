"""A LangGraph agent with a `bash` tool, for rllm's sandboxed tasks (`rllm eval terminal`, `harbor:PATH`).

An ordinary LangGraph graph: a model node (langchain-openai's ChatOpenAI bound to the tool) and a `ToolNode`,
looping until the model answers without a tool call. The only rllm-specific lines: the model is pointed at
`config.base_url` (the episode's gateway session, so every call is recorded with the server's token ids), the
`RLLMCallbackHandler` names the steps by graph node, and the tool runs its command in the episode's sandbox
(`current_sandbox()`; it follows the graph into the ToolNode's worker threads, being a context variable).

    cd examples/agents          # so that `langgraph_bash` imports
    rllm eval terminal --agent langgraph_bash:solve --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B
    rllm eval harbor:/path/to/tasks --agent langgraph_bash:solve --base-url ... --model ...

The model must support tool calls (a chat template with tools; vLLM with `--enable-auto-tool-choice`); for one that
does not, use the built-in terminal agent (`rllm_envs.terminal.agent`), which falls back to a plain-text format.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

import rllm
from rllm_adapters.langgraph import RLLMCallbackHandler
from rllm_core.sandbox import current_sandbox

MAX_TURNS = 30
COMMAND_TIMEOUT_S = 120.0
OUTPUT_CHARS = 4000


@tool
def bash(command: str) -> str:
    """Run a bash command in the task's sandbox; returns its exit code and output (stdout and stderr)."""
    result = current_sandbox().exec(command, timeout_s=COMMAND_TIMEOUT_S)
    out = result.output
    if len(out) > OUTPUT_CHARS:  # keep the head and the tail: an uncut log can fill the context in one turn
        half = OUTPUT_CHARS // 2
        out = f"{out[:half]}\n[... {len(out) - 2 * half} characters cut ...]\n{out[-half:]}"
    timed_out = " (timed out and killed)" if result.timed_out else ""
    return f"exit code: {result.exit_code}{timed_out}\n{out or '(no output)'}"


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(llm: ChatOpenAI) -> Any:
    """model -> (tool calls?) -> tools -> model ... -> end."""
    model = llm.bind_tools([bash])

    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([bash]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


@rllm.rollout(name="langgraph_bash")
def solve(task: rllm.Task, config: Any) -> dict[str, Any]:
    sampling = config.sampling
    llm = ChatOpenAI(base_url=config.base_url, api_key="EMPTY", model=config.model, max_retries=0,
                     temperature=sampling.get("temperature"), max_tokens=sampling.get("max_tokens"))
    workdir = current_sandbox().workdir
    system = (f"You are solving a task in a Linux shell; your working directory is {workdir}. Run commands with "
              "the `bash` tool (each in a fresh shell). When the task is done, reply without calling a tool.")
    messages = [SystemMessage(system), HumanMessage(str(task.instruction))]
    try:
        out = build_graph(llm).invoke({"messages": messages}, config={
            "callbacks": [RLLMCallbackHandler()], "recursion_limit": 2 * MAX_TURNS + 1})
    except GraphRecursionError:  # out of turns: the verifier still scores what the commands did
        return {"answer": "", "stop_reason": "max_turns"}
    return {"answer": str(out["messages"][-1].content), "stop_reason": "done"}
