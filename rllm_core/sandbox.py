"""The sandbox seam: where an agent's shell commands run, isolated, and how a provider plugs in.

A `SandboxProvider` starts a `Sandbox` from a task's `EnvironmentSpec`; the sandbox runs commands (`exec`: command,
timeout, user, env, cwd → exit code + output), moves files in and out (`upload`, `download`) and is always
`close`d (also on Ctrl-C, a crashed agent or a killed run: providers must leave no process or directory behind).
Providers register through the `rllm_register_sandbox_providers` hook as `SandboxProviderSpec(name, factory)`, like
backends and adapters; `get_sandbox_provider(name)` builds one, or lists the installed ones.

While a sandboxed episode runs, `current_sandbox()` returns its sandbox (a context variable, so it follows the
agent into threads and asyncio tasks): that is the handle a user's own `@rllm.rollout` agent gets.

`rllm_testing.sandbox_double` has a provider double (plain subprocesses in a temp dir, no isolation) for tests
of code that uses sandboxes; it is not a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rllm_core.errors import ConfigError, RLLMError
from rllm_core.plugins import PluginManager, get_plugin_manager

__all__ = ["DEFAULT_WORKDIR", "EnvironmentSpec", "ExecResult", "Sandbox", "SandboxError", "SandboxProvider",
           "SandboxProviderSpec", "SandboxResources", "aexec", "current_sandbox", "get_sandbox_provider",
           "get_sandbox_providers", "sandbox_scope"]

DEFAULT_WORKDIR = "/app"
"""The agent's working directory unless a task says otherwise (Terminal-Bench's convention)."""


class SandboxError(RLLMError):
    """A sandbox could not start, run a command or move a file (an episode scores it as `sandbox_error`)."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did. `output` is stdout and stderr interleaved as the command wrote them when the
    provider can (else stdout then stderr); `timed_out` means the whole process tree was killed at the timeout."""

    exit_code: int
    output: str
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False
    """True when the provider kept only the first/last part of a huge output."""


@dataclass(frozen=True)
class SandboxResources:
    """Limits a provider enforces (the task's `[environment]` section)."""

    cpus: float = 1.0
    memory_mb: int = 2048
    processes: int = 256
    disk_mb: int = 2048
    timeout_s: float = 600.0
    """Default per-command timeout."""


@dataclass(frozen=True)
class EnvironmentSpec:
    """Everything a provider needs to start a task's sandbox."""

    name: str
    """The task id (for names and logs)."""
    environment_dir: Path | None = None
    """The task's `environment/` folder: a Dockerfile and the files placed in the working directory."""
    dockerfile: Path | None = None
    image: str | None = None
    """A prebuilt image (providers that run images); None: build `dockerfile`, or the provider's base system."""
    workdir: str = DEFAULT_WORKDIR
    resources: SandboxResources = field(default_factory=SandboxResources)
    network: bool = False
    """Whether the sandbox may reach the network (the local provider never allows it)."""
    env: Mapping[str, str] = field(default_factory=dict)
    hidden: tuple[Path, ...] = ()
    """Host paths the agent must not see even where a provider exposes the host system read-only (the task's own
    folder: its tests/ and solution/ are the answers). The local provider masks each with an empty tmpfs."""


@runtime_checkable
class Sandbox(Protocol):
    """One running sandbox (see the module docstring)."""

    id: str
    workdir: str

    def exec(self, command: str, *, timeout_s: float | None = None, user: str | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None) -> ExecResult:
        """Run `command` with `bash -c` (or `sh -c`) inside; never raises for a failing command (its exit code
        says it), raises SandboxError when the sandbox itself is broken."""

    def upload(self, local: Path, remote: str) -> None:
        """Copy a local file or directory to path `remote` inside the sandbox."""

    def download(self, remote: str, local: Path) -> None:
        """Copy a file or directory from inside the sandbox to `local`."""

    def close(self) -> None:
        """Kill every process of the sandbox and remove what it wrote on the host. Safe to call twice."""


class SandboxProvider(Protocol):
    name: str

    def start(self, spec: EnvironmentSpec) -> Sandbox:
        """A running sandbox for `spec`; SandboxError (or ConfigError for a spec it cannot run) otherwise."""


@dataclass(frozen=True)
class SandboxProviderSpec:
    """A sandbox provider plugin: `factory(**options)` returns a SandboxProvider."""

    name: str
    factory: Callable[..., SandboxProvider]
    description: str = ""
    requires: str | None = None


def get_sandbox_provider(name: str, **options: Any) -> SandboxProvider:
    """The provider registered as `name` (through `rllm_register_sandbox_providers`); lists the installed ones."""
    specs = get_sandbox_providers()
    if name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(f"unknown sandbox provider {name!r}; installed: {known} (see `rllm plugins`)")
    return specs[name].factory(**options)


def get_sandbox_providers(pm: PluginManager | None = None) -> dict[str, SandboxProviderSpec]:
    """Sandbox providers by name (`rllm_register_sandbox_providers`); on a clash the first in call order wins."""
    return (pm or get_plugin_manager()).collect_named("rllm_register_sandbox_providers")


_current: ContextVar[Sandbox | None] = ContextVar("rllm_current_sandbox", default=None)


def current_sandbox() -> Sandbox:
    """The sandbox of the episode running now; RuntimeError outside a sandboxed episode."""
    sandbox = _current.get()
    if sandbox is None:
        raise RuntimeError("no sandbox here: current_sandbox() works inside an episode of a sandboxed benchmark "
                           "(e.g. `rllm eval terminal` or `harbor:PATH`)")
    return sandbox


@contextlib.contextmanager
def sandbox_scope(sandbox: Sandbox) -> Iterator[Sandbox]:
    """Make `sandbox` the current one while the block runs."""
    token = _current.set(sandbox)
    try:
        yield sandbox
    finally:
        _current.reset(token)


async def aexec(sandbox: Sandbox, command: str, **kwargs: Any) -> ExecResult:
    """`sandbox.exec` on a worker thread, so an async agent's event loop keeps serving while a command runs."""
    return await asyncio.to_thread(sandbox.exec, command, **kwargs)
