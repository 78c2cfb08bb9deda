"""The search plugin: registers the `hotpotqa` benchmark and the `rllm retrieve` commands (nothing heavy at load)."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl

__all__ = ["rllm_register_benchmarks", "rllm_register_commands"]


@hookimpl
def rllm_register_benchmarks() -> list[Any]:
    from rllm_envs.search.hotpotqa import HotpotQA

    return [HotpotQA()]


@hookimpl
def rllm_register_commands(app: Any) -> None:
    from rllm_envs.search.cli import retrieve_app

    app.add_typer(retrieve_app, name="retrieve")
