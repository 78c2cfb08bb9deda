"""The built-in benchmarks plugin: registers the benchmarks and the `bench`, `eval` and `model` commands."""

from __future__ import annotations

from typing import Any

import typer

from rllm_core.hookspecs import hookimpl

__all__ = ["rllm_register_benchmarks", "rllm_register_commands"]


@hookimpl
def rllm_register_benchmarks() -> list[Any]:
    from rllm_envs.benchmarks.builtin import builtin_benchmarks

    return builtin_benchmarks()


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    from rllm_envs.benchmarks.cli import bench_app
    from rllm_envs.demos.cli import demos_command
    from rllm_envs.eval.cli import eval_command
    from rllm_envs.eval.model_config import model_app

    app.add_typer(bench_app, name="bench")
    app.command("eval")(eval_command)
    app.command("demos")(demos_command)
    app.add_typer(model_app, name="model")
