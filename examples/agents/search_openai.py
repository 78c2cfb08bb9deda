"""A search agent in the plain OpenAI SDK (Search-R1 style), which `rllm eval` / `rllm train` run as it is.

The loop is what anyone writes with the SDK: offer the tools, run each tool call the model makes, send the results
back as `tool` messages, stop at the first reply without a tool call. Nothing in `answer` knows about rllm; the
only rllm lines are in `agent` at the bottom: the client points at the episode's session URL (`config.base_url`,
so every call is recorded with the server's token ids and logprobs, no key needed), and the tools search the
task's corpus (or the retrieval server named by RLLM_RETRIEVER_URL) through `rllm_envs.search`.

    rllm eval hotpotqa --agent examples/agents/search_openai.py:agent -n 20
    rllm train hotpotqa --agent examples/agents/search_openai.py:agent --max-steps 40

On the embedded SmolLM2-135M, whose chat template has no tools, the policy server writes the tool signatures into
the prompt (the Hermes convention) and parses `<tool_call>` blocks back into `tool_calls`, so this agent runs there
unchanged (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openai import OpenAI

import rllm  # used by `agent` only: `answer` is plain OpenAI SDK code

SYSTEM = ("Answer the question by searching Wikipedia. Call search(query) with a few keywords for one fact at a "
          "time and open(doc_id) to read a passage. When you know the answer, reply without a tool call and end "
          "with one line: 'FINAL ANSWER: <short answer>'.")
TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search Wikipedia passages.",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}, "k": {"type": "integer"}},
                                          "required": ["query"]}}},
    {"type": "function", "function": {"name": "open", "description": "Read a passage by its id.",
                                      "parameters": {"type": "object", "properties": {"doc_id": {"type": "string"}},
                                                     "required": ["doc_id"]}}},
]


def answer(client: OpenAI, model: str, question: str, call_tool: Callable[[str, str], str], max_turns: int = 6,
           seed_for: Callable[[int], int | None] = lambda turn: None, **create: Any) -> tuple[str, int]:
    """(the final reply, the number of model calls); `seed_for(turn)` seeds each call (None: unseeded)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    reply = ""
    for turn in range(1, max_turns + 1):
        seed = seed_for(turn - 1)
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                                  **({"seed": seed} if seed is not None else {}), **create)
        message = response.choices[0].message
        reply = message.content or ""
        if not message.tool_calls:
            return reply, turn
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = call_tool(call.function.name, call.function.arguments)  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return reply, max_turns


@rllm.rollout(name="search_openai")
def agent(task: rllm.Task, config: rllm.RolloutConfig) -> dict[str, Any]:
    from rllm_envs.search.agent import passage_source
    from rllm_envs.search.tools import SearchTools

    tools = SearchTools(passage_source(task))
    sampling = config.sampling
    create = {k: sampling[k] for k in ("temperature", "top_p", "max_tokens") if sampling.get(k) is not None}
    text, turns = answer(OpenAI(base_url=config.base_url, api_key="EMPTY"), config.model,
                         str(task.metadata.get("question") or task.instruction), tools.call,
                         int(task.metadata.get("max_turns", 6)), config.call_seed, **create)
    return {"answer": text, "turns": turns, "retrieved_ids": list(dict.fromkeys(tools.retrieved_ids)),
            "opened_ids": list(dict.fromkeys(tools.opened_ids)), "tool_log": tools.log.records()}
