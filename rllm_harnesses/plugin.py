"""Registers the built-in harnesses (builtin.py); a third party registers its own the same way."""

from __future__ import annotations

from typing import Any

from rllm_core.harness import HarnessSpec
from rllm_core.hookspecs import hookimpl

__all__ = ["rllm_register_commands", "rllm_register_harnesses"]


@hookimpl
def rllm_register_harnesses() -> list[HarnessSpec]:
    from rllm_harnesses.builtin import BUILTIN

    return [HarnessSpec(cls.name, cls, description=(cls.__doc__ or "").split("\n")[0]) for cls in BUILTIN]


@hookimpl
def rllm_register_commands(app: Any) -> None:
    from rllm_harnesses.cli import harness_app

    app.add_typer(harness_app, name="harness")
