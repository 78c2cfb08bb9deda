"""The typer application behind the `rllm` console script.

Subcommands are not imported here: every built-in command module registers itself through the
`rllm_register_commands` hook, exactly as a third-party plugin would, so a broken plugin only loses its
own commands.
"""

from __future__ import annotations

import logging
import os

import typer

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

    pm = get_plugin_manager()
    for impl in pm.hook.rllm_register_commands.get_hookimpls():
        try:
            impl.function(app=app)
        except Exception as exc:  # one plugin's broken commands never take the CLI down
            log.warning("rllm plugin %r failed to add its commands: %s", impl.plugin_name, exc)
    return app


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch threads must not spin when sharing 2 cores
    logging.basicConfig(level=os.environ.get("RLLM_LOG_LEVEL", "WARNING"))
    build_app()()
