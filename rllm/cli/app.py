"""The typer application behind the `rllm` console script.

Subcommands are not imported here: every built-in command module registers itself through the
`rllm_register_commands` hook, exactly as a third-party plugin would, so a broken plugin only loses its
own commands.
"""

from __future__ import annotations

import logging
import os

import typer
from rich.console import Console
from rich.markup import escape

from rllm_core.cpu_runtime import configure_cpu_runtime
from rllm_core.errors import RLLMError
from rllm_core.plugins import get_plugin_manager

__all__ = ["build_app", "main"]

log = logging.getLogger("rllm.cli")


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="rllm",
        help="Reinforcement learning for LLM agents, over the agent frameworks you already use.",
        rich_markup_mode="rich",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root() -> None:
        """Reinforcement learning for LLM agents, over the agent frameworks you already use."""

    get_plugin_manager().call_each("rllm_register_commands", app=app)  # a broken plugin only loses its commands
    return app


def main() -> None:
    """The console script. An `RLLMError` from any command is printed as one line (it says what to do), not
    as a traceback; anything else is a bug and keeps its traceback."""
    configure_cpu_runtime()  # before torch loads: bounded OpenMP spinning, a bounded oneDNN primitive cache
    logging.basicConfig(level=os.environ.get("RLLM_LOG_LEVEL", "WARNING"),
                        format="%(levelname)s %(name)s: %(message)s")  # not "WARNING:rllm.train:..."
    try:
        build_app()()
    except RLLMError as exc:
        Console(stderr=True).print(f"[red]rllm: {escape(str(exc))}[/red]", highlight=False)  # "rllm[x]" stays
        raise SystemExit(2) from None
