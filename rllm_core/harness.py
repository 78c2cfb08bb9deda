"""The harness seam: a CLI coding agent (Claude Code, Codex CLI, mini-swe-agent, OpenCode ...) run unchanged as an
episode's agent, inside its task's sandbox, its model endpoint pointed at the episode's gateway session.

A `Harness` says how its program is installed (`install_command`, the way its users install it: npm or pip),
where an installed copy is (`installed()`: a host folder bound read-only into the sandbox), and how to start it
on a task (`launch`: the shell command, its environment and the config files it reads), given the endpoint the
sandbox reaches (`HarnessEndpoint`: a loopback URL inside the sandbox that leads to that one session and nothing
else; `rllm_harnesses.relay` builds the route). Harnesses register through the `rllm_register_harnesses` hook as
`HarnessSpec(name, factory)`, like adapters and sandbox providers; `get_harness(name)` builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from rllm_core.errors import ConfigError, RLLMError
from rllm_core.plugins import PluginManager, get_plugin_manager

__all__ = ["Harness", "HarnessEndpoint", "HarnessError", "HarnessInstall", "HarnessLaunch", "HarnessSpec",
           "McpHttpServer", "McpServer", "get_harness", "get_harnesses"]

HarnessApi = Literal["chat", "responses", "messages"]


class HarnessError(RLLMError):
    """The harness program could not do its job (it exited at once, it is not installed): the episode is scored
    `harness_error`, with `tail` (the end of its output) kept on it."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


@dataclass(frozen=True)
class HarnessEndpoint:
    """Where the harness's model calls go, as seen from inside the sandbox."""

    base_url: str
    """OpenAI-style base URL, ending in /v1 (a loopback address inside the sandbox)."""
    model: str
    """The model name the harness should send for its policy calls."""
    side_model: str
    """The model name to give the harness for side calls (titles, summaries): recorded as their own agent."""
    api_key: str = "EMPTY"

    @property
    def root_url(self) -> str:
        """The base URL without /v1: what Anthropic-style clients take (they append /v1/messages)."""
        return self.base_url.removesuffix("/v1")


@dataclass(frozen=True)
class HarnessInstall:
    """An installed copy of a harness: `home` (a host folder), bound read-only into the sandbox at `mount`."""

    home: Path
    version: str
    mount: str = "/opt/rllm-harness"


@dataclass(frozen=True)
class McpServer:
    """A stdio MCP server the agent starts itself (`command args`, in the sandbox: where the agent runs, so do the
    servers it spawns). Harnesses that speak MCP take them through `with_mcp`; the others refuse them by name."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class McpHttpServer:
    """An MCP server on the host, over streamable HTTP: an environment's tools (`rllm retrieve mcp --transport
    http`) offered to a CLI agent in its network-less sandbox. The harness relay carries the agent's requests to
    `url` and nowhere else, and records each tool call on the episode (`artifacts["tool_log"]`)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HarnessLaunch:
    """How to start a harness in the sandbox: `command` (run by bash in the task's working directory), its
    environment, and files to write first (sandbox path -> text: the harness's own config files)."""

    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)


class Harness(Protocol):
    name: str
    api: HarnessApi
    """The API the program speaks (what its scripted test upstream must answer)."""
    install_command: str
    """What installs it (shown when it is missing; `rllm harness install NAME` runs the equivalent)."""

    def installed(self) -> HarnessInstall | None:
        """The installed copy, or None."""

    def install(self) -> HarnessInstall:
        """Install it (from the package registries only) and return the copy; HarnessError with the failing step."""

    def launch(self, instruction: str, endpoint: HarnessEndpoint, install: HarnessInstall, *,
               max_turns: int) -> HarnessLaunch:
        """The command that runs the program on `instruction`, non-interactively, within `max_turns` turns."""


@dataclass(frozen=True)
class HarnessSpec:
    """A harness plugin: `factory()` returns a Harness."""

    name: str
    factory: Callable[[], Harness]
    description: str = ""


def get_harnesses(pm: PluginManager | None = None) -> dict[str, HarnessSpec]:
    """Harnesses by name (`rllm_register_harnesses`); on a clash the first in call order wins."""
    return (pm or get_plugin_manager()).collect_named("rllm_register_harnesses")


def get_harness(name: str) -> Harness:
    """The harness registered as `name`; a ConfigError listing the known ones otherwise."""
    specs = get_harnesses()
    if name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(f"unknown harness {name!r}; known: {known} (see `rllm plugins`)")
    return specs[name].factory()
