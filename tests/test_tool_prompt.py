"""Tools for a chat template without them: the Hermes convention written into the messages by the policy server,
so an agent that sends `tools` works unchanged on SmolLM2 and tiny-random, and the prompt ids carry the tools."""

from __future__ import annotations

import json

from openai import OpenAI

from rllm_serve import start_policy_server
from rllm_serve.responses import parse_tool_calls
from rllm_serve.tool_prompt import tools_in_messages

TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search passages.",
                                           "parameters": {"type": "object",
                                                          "properties": {"query": {"type": "string"}}}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "kiss and tell"}'}}


def test_tools_go_into_the_system_message_and_tool_turns_become_text() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "c2"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "first"},
                {"role": "tool", "tool_call_id": "c2", "content": "second"}]
    out = tools_in_messages(messages, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]["function"]) in out[0]["content"]
    assert out[2]["content"].count("<tool_call>") == 2 and "tool_calls" not in out[2]
    content, calls = parse_tool_calls(out[2]["content"])  # what the model is shown parses as what it sent
    assert content is None and [c["function"]["name"] for c in calls] == ["search", "search"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"query": "kiss and tell"}
    assert out[3]["content"] == "<tool_response>\nfirst\n</tool_response>\n<tool_response>\nsecond\n</tool_response>"
    assert messages[2]["tool_calls"] == [CALL, {**CALL, "id": "c2"}]  # the caller's messages are left as they were
    bare = tools_in_messages([{"role": "user", "content": "hi"}], TOOLS)
    assert bare[0]["role"] == "system" and bare[1] == {"role": "user", "content": "hi"}


def test_a_template_without_tools_serves_them_in_the_prompt() -> None:
    server = start_policy_server("tiny-random")
    try:
        client = OpenAI(base_url=server.base_url, api_key="EMPTY")
        plain = client.chat.completions.create(model=server.model_name, max_tokens=2,
                                               messages=[{"role": "user", "content": "hi"}])
        with_tools = client.chat.completions.create(model=server.model_name, max_tokens=2, tools=TOOLS,  # type: ignore[arg-type]
                                                    messages=[{"role": "user", "content": "hi"}])
        turn = client.chat.completions.create(
            model=server.model_name, max_tokens=2, tools=TOOLS,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                      {"role": "tool", "tool_call_id": "c1", "content": "a result"}])
    finally:
        server.stop()
    assert plain.usage and with_tools.usage and turn.usage
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 40  # the signatures are in the prompt
    assert turn.usage.prompt_tokens > with_tools.usage.prompt_tokens
