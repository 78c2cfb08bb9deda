"""The extension points of rllm, as pluggy hook specifications.

A plugin is any module or object with functions named like these and marked with `hookimpl`; it is found
through the setuptools entry-point group ``rllm``. The built-in adapters, backends, benchmarks and CLI
commands register through exactly these hooks, so a third-party plugin has the same power as a built-in.

Registration hooks return lists of specs; each spec type lives beside its seam, with that seam's `get_X()`
(the plugin manager itself knows no plugin kinds):

- ``rllm_register_adapters() -> list[AdapterSpec]``          (rllm_core.adapters.AdapterSpec)
- ``rllm_register_backends() -> list[BackendSpec]``          (rllm_train.backend.BackendSpec)
- ``rllm_register_benchmarks() -> list[Benchmark]``          (rllm_rollout.benchmarks.base.Benchmark)
- ``rllm_register_benchmark_sources() -> list[BenchmarkSourceSpec]`` (rllm_rollout.benchmarks.registry)
                                                              `PREFIX:ARG` names built on demand (`harbor:./tasks`)
- ``rllm_register_eval_endpoints() -> list[EvalEndpointSpec]`` (rllm_envs.eval.endpoint) models a backend serves
                                                              for `rllm eval --backend NAME`
- ``rllm_register_commands(app)``                            adds typer commands / sub-apps to the CLI
- ``rllm_register_loggers() -> list[LoggerSpec]``            (rllm_core.loggers.LoggerSpec) metric loggers for
                                                              `rllm train --logger NAME` (TensorBoard, W&B, ...)
- ``rllm_register_sandbox_providers() -> list[SandboxProviderSpec]`` (rllm_core.sandbox) where agents' commands
                                                              run: `--sandbox local|docker|modal|daytona`
- ``rllm_register_harnesses() -> list[HarnessSpec]``          (rllm_core.harness) CLI agents run unchanged in a
                                                              sandbox: `--harness claude-code|codex|...`

Every hook is called through pluggy (`pm.hook.<name>(...)`), in pluggy's order: `tryfirst` implementations
first, then the most recently registered plugin first, `trylast` ones last. A `@hookimpl(wrapper=True)`
implementation wraps the call with pluggy's new-style semantics (it yields, gets the result, returns it, maybe
changed); the old-style `hookwrapper=True` is refused at registration. An exception in one implementation
is logged (registration hooks: also shown by `rllm plugins`) and the others still run; a wrapper does not see it.

Event hooks:

- ``rllm_on_episode_end(episode)``  when a rollout has produced its Episode (before rewards are applied), once
                                    per episode, in the process that ran the agent: for a Ray run that is the
                                    worker, where in-process records live (adapters join their call logs into
                                    the steps here); what it changes in the episode travels back with it
- ``rllm_on_llm_call(step)``        once for each Step of a finished episode, in the DRIVER process (the one
                                    that called `Rollout.run` / `run_episodes` / `run_episodes_ray`), after
                                    that episode's ``rllm_on_episode_end``: never in a gateway process or a
                                    Ray worker, so a driver-side plugin counts each call exactly once. Steps
                                    of calls whose episode never comes back (a worker that died) are not sent
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
    def rllm_register_benchmark_sources(self) -> list[Any]:
        """Return BenchmarkSourceSpec objects: benchmarks built on demand from a `PREFIX:ARG` name."""
        raise NotImplementedError

    @hookspec
    def rllm_register_eval_endpoints(self) -> list[Any]:
        """Return EvalEndpointSpec objects: the models a backend serves for `rllm eval --backend NAME`."""
        raise NotImplementedError

    @hookspec
    def rllm_register_commands(self, app: Any) -> None:
        """Add commands or sub-apps to the `rllm` typer application."""
        raise NotImplementedError

    @hookspec
    def rllm_register_loggers(self) -> list[Any]:
        """Return LoggerSpec objects (rllm_core.loggers) for the metric loggers this plugin provides."""
        raise NotImplementedError

    @hookspec
    def rllm_register_sandbox_providers(self) -> list[Any]:
        """Return SandboxProviderSpec objects (rllm_core.sandbox) for the sandbox providers this plugin provides."""
        raise NotImplementedError

    @hookspec
    def rllm_register_harnesses(self) -> list[Any]:
        """Return HarnessSpec objects (rllm_core.harness) for the CLI agents this plugin can run in a sandbox."""
        raise NotImplementedError

    @hookspec
    def rllm_on_llm_call(self, step: Any) -> None:
        """Called once with each Step of a finished episode, in the driver process (see the module docstring)."""
        raise NotImplementedError

    @hookspec
    def rllm_on_episode_end(self, episode: Any) -> None:
        """Called once with each finished Episode, in the process that ran its agent (see the module docstring)."""
        raise NotImplementedError
