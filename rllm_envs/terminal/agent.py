"""The built-in terminal agent: a multi-turn shell agent for sandboxed tasks (`rllm eval terminal`, `harbor:PATH`).

Each turn is one LLM call through the episode's OpenAI client (`config.base_url`, so the gateway records it as a
Step with the server's token ids) with the rollout config's sampling; the command it asks for runs in
`current_sandbox()` and its exit code and output come back as the next message: a `role: tool` message in the
tool format, a user message in the text format. The history only grows, so packing merges the turns of an
episode into one train row with the observations masked out.

It ends when the model answers without a command (tools) or says DONE (text), at `max_turns`, when the time budget
is spent (the task's agent timeout, less a margin so the verifier still scores what was done), after
`max_format_errors` replies in a row that it could not act on, or when the model endpoint refuses a call (server
error: `model_error`; a prompt longer than the model's context: `context_exceeded`, with
`artifacts["context_exceeded_at_turn"]` the refused turn, so the episode is scored `context_exceeded` unless the
verifier finds the task done): never with an exception of its own. `artifacts["stop_reason"]` says which. Sandbox errors
(`SandboxError`) are not caught: the sandboxed episode around the agent scores them as `sandbox_error`.

`action_format="auto"` (the default) offers the `bash` tool and, when the server refuses tools (a chat template
without them, vLLM without a tool parser), switches to the text format for the rest of the episode and for later
episodes against the same endpoint and model.

Options: `make_terminal_agent(**options)` for an agent with other defaults; per run, `task.metadata["max_turns"]`
(what `rllm eval --max-turns N` sets) then a `terminal_agent={...}` field of the rollout config
(`rollout.arun(task, ..., terminal_agent={"max_turns": 10})`); per task, `task.metadata["terminal_agent"]`. Later
ones win. See `TerminalAgentOptions`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Literal

import openai
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rllm_core.context import AGENT_HEADER, current_agent
from rllm_core.errors import ConfigError
from rllm_core.sandbox import Sandbox, aexec, current_sandbox
from rllm_core.types import Task
from rllm_envs.terminal.actions import (
    BASH_TOOL,
    DONE_WORD,
    format_observation,
    parse_bash_arguments,
    parse_text_action,
)
from rllm_rollout.chat import _split_params, make_client, task_text
from rllm_rollout.engine import context_exceeded_message
from rllm_rollout.rollout import Rollout, RolloutConfig, rollout

__all__ = ["AGENT_TIMEOUT_KEYS", "StopReason", "TerminalAgentOptions", "make_terminal_agent", "system_prompt",
           "terminal_agent"]

StopReason = Literal["done", "max_turns", "time_budget", "format_errors", "context_exceeded", "model_error"]

AGENT_TIMEOUT_KEYS = ("agent_timeout_s", "agent_timeout_sec")
"""`task.metadata` keys read (first found wins) for the task's agent timeout, which sets the time budget."""

DEFAULT_TIME_BUDGET_S = 600.0


class TerminalAgentOptions(BaseModel):
    """How the terminal agent runs; every field has a default."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(30, ge=1)
    """LLM calls at most (a refused tools call that made the agent switch to text is not counted)."""
    time_budget_s: float | None = Field(None, gt=0)
    """None: the task's agent timeout (`task.metadata`, see AGENT_TIMEOUT_KEYS) less 10 % (at most 30 s) so the
    verifier still runs on what was done; 600 s when the task gives none."""
    command_timeout_s: float = Field(180.0, gt=0)
    """One command's timeout (capped by what is left of the time budget); its whole process tree is killed."""
    max_observation_chars: int = Field(4000, ge=200)
    """Longer command output keeps its first and last half of this many characters."""
    action_format: Literal["auto", "tools", "text"] = "auto"
    max_format_errors: int = Field(3, ge=1)
    """Replies in a row the agent could not act on (a text reply with neither a block nor DONE, a malformed tool
    call, a reply cut off by max_tokens before any command) before the episode ends with `format_errors`."""
    max_tokens: int | None = Field(None, ge=1)
    """Per-turn token cap used only when the rollout config's sampling sets none (a server otherwise lets a
    reply run to the end of the context)."""


_NO_TOOLS: set[tuple[str, str]] = set()
"""(upstream, model) pairs whose server refused the `tools` parameter: `auto` starts those in text format."""


def system_prompt(action_format: Literal["tools", "text"], workdir: str) -> str:
    """The short system prompt: the working directory, how to run a command, how to finish."""
    intro = (f"You are an agent solving a task in a Linux shell. Your working directory is {workdir}. Each command "
             f"runs in a fresh bash shell started in {workdir} (cd and variables do not carry over); you get its "
             "exit code and output. Work step by step and check your work.")
    if action_format == "tools":
        return f"{intro}\nRun commands with the `bash` tool. When the task is done, reply without calling a tool."
    return (f"{intro}\nTo run a command, reply with exactly one fenced block:\n```bash\n<command>\n```\n"
            f"When the task is done, reply with {DONE_WORD} and no block.")


def make_terminal_agent(name: str = "terminal", **options: Any) -> Rollout:
    """A terminal agent rollout with these default options (see `TerminalAgentOptions`); a bad option is a
    ConfigError now, not at the first episode. Picklable (a partial of a module function), so it runs on Ray."""
    return rollout(functools.partial(_terminal, _options(options, "make_terminal_agent")), name=name)


async def _terminal(defaults: TerminalAgentOptions, task: Task, config: RolloutConfig) -> dict[str, Any]:
    turns = task.metadata.get("max_turns")
    opts = _merged(defaults, ("task.metadata['max_turns']", None if turns is None else {"max_turns": turns}),
                   ("config.terminal_agent", getattr(config, "terminal_agent", None)),
                   ("task.metadata['terminal_agent']", task.metadata.get("terminal_agent")))
    return await _Episode(task, config, opts, current_sandbox()).run()


def _options(raw: Any, where: str) -> TerminalAgentOptions:
    try:
        return TerminalAgentOptions.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err.get("loc", ())) or "options"
        raise ConfigError(f"terminal agent ({where}): bad option {field!r}: {err.get('msg')}; the options are "
                          f"{', '.join(TerminalAgentOptions.model_fields)}") from None


def _merged(base: TerminalAgentOptions, *overrides: tuple[str, Any]) -> TerminalAgentOptions:
    """`base` overlaid by each override dict in turn, each checked (so an error names where the bad option was)."""
    merged = base.model_dump(exclude_unset=True)
    for where, extra in overrides:
        if extra is None:
            continue
        if not isinstance(extra, dict):
            raise ConfigError(f"terminal agent: {where} must be a dict of options, got {type(extra).__name__}")
        _options(extra, where)
        merged.update(extra)
    return _options(merged, "options")


def time_budget(task: Task, opts: TerminalAgentOptions) -> float:
    """The episode's time budget in seconds (see `TerminalAgentOptions.time_budget_s`)."""
    if opts.time_budget_s is not None:
        return opts.time_budget_s
    for key in AGENT_TIMEOUT_KEYS:
        value = task.metadata.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value) - min(30.0, 0.1 * float(value))
    return DEFAULT_TIME_BUDGET_S


class _Episode:
    """One run of the agent: the message history, what ran, why it stopped."""

    def __init__(self, task: Task, config: RolloutConfig, opts: TerminalAgentOptions, sandbox: Sandbox) -> None:
        self.task, self.config, self.opts, self.sandbox = task, config, opts, sandbox
        self.key = (config.upstream_url or config.base_url.split("/sessions/")[0], config.model)
        fmt = opts.action_format
        self.format: Literal["tools", "text"] = ("text" if self.key in _NO_TOOLS else "tools") if fmt == "auto" \
            else fmt
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(self.format, sandbox.workdir)},
            {"role": "user", "content": task_text(task)},
        ]
        self.commands: list[dict[str, Any]] = []
        self.calls = 0
        self.turns = 0
        self.format_errors = 0
        self.answer = ""
        self.error: str | None = None
        self.context_exceeded_at: int | None = None
        self.budget = time_budget(task, opts)
        self.deadline = time.monotonic() + self.budget

    async def run(self) -> dict[str, Any]:
        stop: StopReason
        async with make_client(self.config) as client:
            timer = asyncio.timeout(self.budget)
            try:
                async with timer:
                    stop = await self._loop(client)
            except TimeoutError:
                if not timer.expired():
                    raise
                stop = "time_budget"
        out: dict[str, Any] = {"answer": self.answer, "stop_reason": stop, "turns": self.turns,
                               "action_format": self.format, "commands": self.commands,
                               "time_budget_s": self.budget, "max_turns": self.opts.max_turns}
        if self.error is not None:
            out["error"] = self.error
        if self.context_exceeded_at is not None:
            out["context_exceeded_at_turn"] = self.context_exceeded_at
        return out

    async def _loop(self, client: openai.AsyncOpenAI) -> StopReason:
        while self.turns < self.opts.max_turns:
            try:
                message, finish = await self._call(client)
            except openai.APIError as exc:
                if self._refused_tools(exc):
                    continue
                self.error = f"{type(exc).__name__}: {_api_message(exc)}"
                if context_exceeded_message(exc) is None:
                    return "model_error"
                self.context_exceeded_at = self.turns + 1
                return "context_exceeded"
            self.turns += 1
            if message is None:
                self.error = "the model endpoint answered with no choices"
                return "model_error"
            self.answer = message.content or ""
            stop = await (self._tool_turn(message, finish) if self.format == "tools" else self._text_turn(finish))
            if stop is not None:
                return stop
        return "max_turns"

    async def _call(self, client: openai.AsyncOpenAI) -> tuple[Any, str | None]:
        params = {**self.config.sampling}
        if params.get("max_tokens") is None and params.get("max_completion_tokens") is None and self.opts.max_tokens:
            params["max_tokens"] = self.opts.max_tokens
        seed = self.config.call_seed(self.calls)
        if seed is not None:
            params["seed"] = seed
        sdk, extra = _split_params(params)
        agent = current_agent()
        self.calls += 1
        resp = await client.chat.completions.create(
            model=self.config.model, messages=self.messages,  # type: ignore[arg-type]
            tools=[BASH_TOOL] if self.format == "tools" else openai.NOT_GIVEN,  # type: ignore[list-item]
            extra_body=extra or None, extra_headers={AGENT_HEADER: agent} if agent else None, **sdk,
        )
        if not resp.choices:
            return None, None
        choice = resp.choices[0]
        return choice.message, choice.finish_reason

    def _refused_tools(self, exc: openai.APIError) -> bool:
        """In `auto`, a 400 about tools switches this episode (and later ones on this endpoint) to text."""
        if not (self.opts.action_format == "auto" and self.format == "tools"
                and isinstance(exc, openai.BadRequestError) and "tool" in _api_message(exc).lower()):
            return False
        _NO_TOOLS.add(self.key)
        self.format = "text"
        self.messages[0] = {"role": "system", "content": system_prompt("text", self.sandbox.workdir)}
        return True

    async def _tool_turn(self, message: Any, finish: str | None) -> StopReason | None:
        calls = list(message.tool_calls or [])
        entry: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                   for c in calls]
        self.messages.append(entry)
        if not calls:
            if finish == "length":  # cut off before it could call a tool: not a decision to stop
                return self._format_error(_CUT_OFF.format(what="a tool call"))
            return "done"
        ran = False
        for call in calls:
            command, problem = parse_bash_arguments(call.function.name, call.function.arguments)
            content = problem or await self._run(command or "")
            ran = ran or problem is None
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if ran:
            self.format_errors = 0
            return None
        self.format_errors += 1
        return "format_errors" if self.format_errors >= self.opts.max_format_errors else None

    async def _text_turn(self, finish: str | None) -> StopReason | None:
        self.messages.append({"role": "assistant", "content": self.answer})
        action = parse_text_action(self.answer)
        if action.kind == "done":
            return "done"
        if action.kind == "none":
            if finish == "length":
                return self._format_error(_CUT_OFF.format(what="a complete ```bash block"))
            return self._format_error(f"No command found. Reply with one ```bash block holding the command to "
                                      f"run, or with {DONE_WORD} when the task is done.")
        self.format_errors = 0
        observation = await self._run(action.command)
        if action.blocks > 1:
            observation += f"\n(only the first of your {action.blocks} blocks ran: send one per reply)"
        self.messages.append({"role": "user", "content": observation})
        return None

    def _format_error(self, text: str) -> StopReason | None:
        """Tell the model what to send instead; a few in a row end the episode."""
        self.format_errors += 1
        if self.format_errors >= self.opts.max_format_errors:
            return "format_errors"
        self.messages.append({"role": "user", "content": text})
        return None

    async def _run(self, command: str) -> str:
        left = self.deadline - time.monotonic()
        timeout = max(1.0, min(self.opts.command_timeout_s, left))
        result = await aexec(self.sandbox, command, timeout_s=timeout)
        self.commands.append({"command": command[:2000], "exit_code": result.exit_code,
                              "timed_out": result.timed_out, "duration_s": round(result.duration_s, 3)})
        return format_observation(result, self.opts.max_observation_chars)


_CUT_OFF = "Your reply was cut off at the token limit before {what}. Be brief: send the next command only."


def _api_message(exc: openai.APIError) -> str:
    """The server's own error message where it sent one (OpenAI's and vLLM's `{"error": {"message": ...}}`)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
    return str(exc.message if hasattr(exc, "message") else exc)


terminal_agent = make_terminal_agent()
"""The default terminal agent (rollout name `terminal`): `--agent rllm_envs.terminal.agent:terminal_agent`."""
