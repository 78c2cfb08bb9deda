"""The extension points of rllm, as pluggy hook specifications.

A plugin is any module or object with functions named like these and marked with `hookimpl`; it is found
through the setuptools entry-point group ``rllm``. The built-in adapters, backends, benchmarks and CLI
commands register through exactly these hooks, so a third-party plugin has the same power as a built-in.

Registration hooks return lists of specs (each module that consumes them defines its spec type):

- ``rllm_register_adapters() -> list[AdapterSpec]``          (rllm_core.plugins.AdapterSpec)
- ``rllm_register_backends() -> list[BackendSpec]``          (rllm_core.plugins.BackendSpec)
- ``rllm_register_benchmarks() -> list[Benchmark]``          (rllm_core.benchmarks registry types)
- ``rllm_register_commands(app)``                            adds typer commands / sub-apps to the CLI

Event hooks are called for every plugin that implements them; an exception in one is logged, not raised:

- ``rllm_on_llm_call(step)``        right after a Step is recorded (gateway or in-process); it runs on the
                                    gateway's event loop or the agent's thread, so keep it quick
- ``rllm_on_episode_end(episode)``  when a rollout has produced its Episode (before rewards are applied)
"""

from __future__ import annotations

from typing import Any

import pluggy

__all__ = ["PROJECT", "RLLMHookSpec", "hookimpl", "hookspec"]

PROJECT = "rllm"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class RLLMHookSpec:
    """Hook specifications; see the module docstring for the contract of each."""

    @hookspec
    def rllm_register_adapters(self) -> list[Any]:
        """Return AdapterSpec objects for the agent frameworks this plugin captures."""
        raise NotImplementedError

    @hookspec
    def rllm_register_backends(self) -> list[Any]:
        """Return BackendSpec objects for the training backends this plugin provides."""
        raise NotImplementedError

    @hookspec
    def rllm_register_benchmarks(self) -> list[Any]:
        """Return Benchmark objects this plugin provides."""
        raise NotImplementedError

    @hookspec
    def rllm_register_commands(self, app: Any) -> None:
        """Add commands or sub-apps to the `rllm` typer application."""
        raise NotImplementedError

    @hookspec
    def rllm_on_llm_call(self, step: Any) -> None:
        """Called with each recorded Step."""
        raise NotImplementedError

    @hookspec
    def rllm_on_episode_end(self, episode: Any) -> None:
        """Called with each finished Episode."""
        raise NotImplementedError
