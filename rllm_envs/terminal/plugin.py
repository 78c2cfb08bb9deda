"""Registers the built-in `terminal` benchmark; nothing heavy is imported until the registry asks for it."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl

__all__ = ["rllm_register_benchmarks"]


@hookimpl
def rllm_register_benchmarks() -> list[Any]:
    from rllm_envs.terminal.benchmark import TerminalBenchmark

    return [TerminalBenchmark()]
