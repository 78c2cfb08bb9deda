"""Function tools for a model whose chat template knows none (SmolLM2, tiny-random, many base models).

An agent written the usual way sends `tools` and expects `tool_calls` back, whatever model is behind the URL. A
template that ignores `tools` would silently drop them (the model would never know it has tools), and refusing
them breaks the agent. So the server writes them into the conversation in the Hermes convention that Qwen2.5,
Hermes and SmolLM3 templates use and that the response side already parses (`responses.parse_tool_calls`):

- the tool signatures go into the system message, in `<tools></tools>`, with how to call one:
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- an assistant turn's earlier `tool_calls` are written back as those blocks after its text;
- tool results become a user turn of `<tool_response>` blocks (consecutive results share one turn, as Qwen's
  template does), since a plain template has no `tool` role the model was trained on.

The prompt ids of such a request are what the engine samples from, so capture and training stay exact; only the
text the model sees differs from a template that has tools of its own.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ChatRenderer", "content_text", "tools_in_messages"]

_PREAMBLE = (
    "# Tools\n\nYou can call functions to help with the user's request. Their signatures, as JSON, are inside "
    "<tools></tools>:\n<tools>\n{tools}\n</tools>\n\nTo call one, reply with a JSON object holding its name and "
    "arguments inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
    '{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n</tool_call>\n'
    "The results come back inside <tool_response></tool_response> tags."
)


def _call_block(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass  # sent back as the string the client holds
    return "<tool_call>\n" + json.dumps({"name": fn.get("name", ""), "arguments": args}) + "\n</tool_call>"


def content_text(content: Any) -> str:
    """A message's content as text: its parts' texts joined, None as ""."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def tools_in_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `tools` and the tool turns written in the Hermes convention (see the module docstring)."""
    preamble = _PREAMBLE.format(tools="\n".join(json.dumps(t.get("function", t)) for t in tools))
    out: list[dict[str, Any]] = []
    if messages and messages[0].get("role") in ("system", "developer"):
        first = content_text(messages[0].get("content"))
        out.append({"role": "system", "content": f"{first}\n\n{preamble}" if first else preamble})
        rest = messages[1:]
    else:
        out.append({"role": "system", "content": preamble})
        rest = messages
    for m in rest:
        role = m.get("role")
        if role == "tool":
            block = f"<tool_response>\n{content_text(m.get('content'))}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        elif role == "assistant" and m.get("tool_calls"):
            text = content_text(m.get("content"))
            blocks = "\n".join(_call_block(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{text}\n{blocks}" if text else blocks})
        else:
            out.append(dict(m))
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]


class ChatRenderer:
    """A chat request's prompt ids as the policy server makes them: `tools` through the template when it shows
    them, else written into the messages (`tools_in_messages`); content parts joined. `rllm sft` renders its chat
    data and id-less captured calls with the same object, so a trained row is what the server would have sampled."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        template = getattr(tokenizer, "chat_template", None) or ""
        template = template if isinstance(template, str) else json.dumps(template)
        self.tokenizer, self.tools = tokenizer, tools or None
        self.kwargs = dict(template_kwargs or {})
        self.template_shows_tools = "tools" in template
        if self.tools and self.template_shows_tools:
            self.kwargs["tools"] = self.tools

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`messages` as the template is given them."""
        if self.tools and not self.template_shows_tools:
            messages = tools_in_messages(messages, self.tools)
        return [{**m, "content": content_text(m.get("content"))} for m in messages]

    def ids(self, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        """Token ids of already prepared `messages` (`self.messages`)."""
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=generation_prompt, **self.kwargs)
        return list(self.tokenizer.encode(text, add_special_tokens=False))
