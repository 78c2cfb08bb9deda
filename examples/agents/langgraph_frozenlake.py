"""A LangGraph agent that plays FrozenLake, which `rllm train` trains as it is.

An ordinary LangGraph graph of two nodes: `player` (langchain-openai's ChatOpenAI: read the conversation, reply
with a move) and `env` (step a gymnasium FrozenLake env with the move parsed from the reply, append what it sees
as a HumanMessage), looping until the goal, a hole, or the task's turn limit. Nothing in the graph knows about
rllm; the only rllm lines are in the rollout function `agent` at the bottom: it points ChatOpenAI at the
episode's gateway session (`config.base_url`, so every call is recorded with the server's token ids and
logprobs), samples with the run's settings (`config.sampling`, a seed per call from `config.call_seed`),
attaches `RLLMCallbackHandler` (the calls' trajectory is named after the graph node: "player") and returns the
artifacts the FrozenLake benchmark scores (the same keys as its built-in agent's).

    rllm eval frozenlake --agent examples/agents/langgraph_frozenlake.py:agent --max-examples 20
    rllm train frozenlake --agent examples/agents/langgraph_frozenlake.py:agent --max-steps 80

The conversation only grows (the map, then move / observation pairs), so with rllm's policy server the gateway
continues each turn from the previous turn's exact tokens and the whole game packs into ONE training row: the
model's moves are trained, the observations between them are masked out (`pack/rows_split` stays 0). A row
longer than `--max-seq-len` (1024 tokens by default) is truncated: with a large `--max-tokens`, raise it too.

Outcomes (`artifacts["outcome"]`): "goal", "hole", "max_turns" (out of turns), "format" (no valid move at all),
and "context_exceeded": the server refused a turn because the conversation no longer fits the model's context
(prompt + max_tokens over its context length, HTTP 400); the episode ends there, with
`context_exceeded_at_turn` (the refused call, 1-based) and the server's `context_exceeded_message`, and is
scored on the moves made so far (the refused call is recorded as a failed step, which is not trained on).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import gymnasium as gym
import openai
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import SecretStr

import rllm  # used by `agent` only: the graph above it is plain LangGraph
from rllm_adapters.langgraph import RLLMCallbackHandler

ACTIONS = ("LEFT", "DOWN", "RIGHT", "UP")
INVALID = "Invalid move. Reply with one of LEFT, DOWN, RIGHT, UP."
_CONTEXT = re.compile(r"context[ _]?(length|window|size)|max(imum)?[ _]model[ _]len|no room in the model"
                      r"|prompt is too long", re.I)
"""How rllm's policy server, vLLM, OpenAI, SGLang and llama.cpp word "the prompt does not fit the context"."""


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    actions: list[str]
    invalid_moves: int
    reward: float
    outcome: str | None
    refusal: str | None  # the server's message when it refused a turn as too long for its context


def parse_move(text: str) -> int | None:
    """The last move word in the reply (case-insensitive), or None."""
    found = re.findall(r"\b(LEFT|DOWN|RIGHT|UP)\b", text or "", flags=re.IGNORECASE)
    return ACTIONS.index(found[-1].upper()) if found else None


def render(desc: list[str], state: int) -> str:
    """The map with the player's square marked P."""
    n = len(desc[0])
    rows = [list(r) for r in desc]
    rows[state // n][state % n] = "P"
    return "\n".join("".join(r) for r in rows)


def context_exceeded(exc: openai.APIStatusError) -> bool:
    """The server refused the request (400 / 413) because the prompt plus max_tokens is over its context."""
    return exc.status_code in (400, 413) and (
        getattr(exc, "code", None) == "context_length_exceeded" or bool(_CONTEXT.search(str(exc))))


def build_graph(llm: ChatOpenAI, env: Any, desc: list[str], max_turns: int,
                seed_for: Callable[[int], int | None] | None = None) -> Any:
    """player -> env -> player ... until the goal, a hole, `max_turns` replies, or a full context."""

    def player(state: State) -> dict[str, Any]:
        turn = sum(isinstance(m, AIMessage) for m in state["messages"])
        seed = seed_for(turn) if seed_for is not None else None
        model = llm.bind(seed=seed) if seed is not None else llm
        try:
            reply = model.invoke(state["messages"])
        except openai.APIStatusError as exc:
            if context_exceeded(exc):
                return {"outcome": "context_exceeded", "refusal": str(exc)[:500]}
            raise
        return {"messages": [reply]}

    def step_env(state: State) -> dict[str, Any]:
        actions, invalid, reward = list(state["actions"]), state["invalid_moves"], state["reward"]
        move = parse_move(str(state["messages"][-1].content))
        outcome: str | None = None
        if move is None:
            invalid += 1
            observation = INVALID
        else:
            position, r, terminated, truncated, _ = env.step(move)
            actions.append(ACTIONS[move])
            reward += float(r)
            if terminated or truncated:
                outcome = "goal" if r > 0 else "hole"
            observation = f"You moved {ACTIONS[move]}.\n{render(desc, int(position))}\n\nYour move?"
        if outcome is None and len(actions) + invalid >= max_turns:
            outcome = "max_turns"
        update: dict[str, Any] = {"actions": actions, "invalid_moves": invalid, "reward": reward, "outcome": outcome}
        if outcome is None:  # the game goes on: the model sees what its move did
            update["messages"] = [HumanMessage(observation)]
        return update

    def route(state: State) -> str:
        return END if state["outcome"] is not None else "next"

    graph = StateGraph(State)
    graph.add_node("player", player)
    graph.add_node("env", step_env)
    graph.add_edge(START, "player")
    graph.add_conditional_edges("player", route, {"next": "env", END: END})
    graph.add_conditional_edges("env", route, {"next": "player", END: END})
    return graph.compile()


def play(llm: ChatOpenAI, instruction: str, desc: list[str], max_turns: int,
         seed_for: Callable[[int], int | None] | None = None, callbacks: list[Any] | None = None) -> dict[str, Any]:
    """One game; the artifacts FrozenLake scores (env_reward, reached_goal, outcome, actions, invalid_moves)."""
    env = gym.make("FrozenLake-v1", desc=desc, is_slippery=False)
    env.reset(seed=0)
    try:
        start: State = {"messages": [HumanMessage(instruction)], "actions": [], "invalid_moves": 0, "reward": 0.0,
                        "outcome": None, "refusal": None}
        out = build_graph(llm, env, desc, max_turns, seed_for).invoke(
            start, config={"callbacks": callbacks or [], "recursion_limit": 2 * max_turns + 4})
    finally:
        env.close()
    replies = [m for m in out["messages"] if isinstance(m, AIMessage)]
    outcome = out["outcome"] or "max_turns"
    if outcome == "max_turns" and not out["actions"] and out["invalid_moves"]:
        outcome = "format"
    art = {"answer": str(replies[-1].content) if replies else "", "env_reward": out["reward"],
           "reached_goal": out["reward"] > 0, "outcome": outcome, "actions": out["actions"],
           "invalid_moves": out["invalid_moves"], "turns": len(replies), "max_turns": max_turns}
    if outcome == "context_exceeded":  # the refused call: the one after the replies that came back
        art.update(context_exceeded_at_turn=len(replies) + 1, context_exceeded_message=out["refusal"])
    return art


@rllm.rollout(name="langgraph_frozenlake")
def agent(task: rllm.Task, config: rllm.RolloutConfig) -> dict[str, Any]:
    sampling = config.sampling
    llm = ChatOpenAI(base_url=config.base_url, api_key=SecretStr("EMPTY"), model=config.model, max_retries=0,
                     temperature=sampling.get("temperature"), max_completion_tokens=sampling.get("max_tokens"),
                     top_p=sampling.get("top_p"))
    # task.instruction is the benchmark's prompt: the rules and the map with the start marked P
    return play(llm, str(task.instruction), list(task.metadata["desc"]), int(task.metadata.get("max_turns", 16)),
                seed_for=config.call_seed, callbacks=[RLLMCallbackHandler()])
