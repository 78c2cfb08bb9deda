"""The FinQA plugin: registers the `finqa` benchmark (tool-calling agent over SQLite tables)."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl

__all__ = ["rllm_register_benchmarks"]


@hookimpl
def rllm_register_benchmarks() -> list[Any]:
    from rllm_envs.finqa.benchmark import FinQA

    return [FinQA()]
