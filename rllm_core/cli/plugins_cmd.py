"""`rllm plugins`: what was loaded (name, kind, version) and what failed to load."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import get_plugin_manager

__all__ = ["plugins_command"]


def plugins_command(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """List the loaded rllm plugins: name, kind, version, and any that failed to load."""
    infos = get_plugin_manager().infos
    if as_json:
        rows = [{"name": i.name, "kind": i.kind, "version": i.version, "source": i.source, "error": i.error}
                for i in infos]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="rllm plugins")
    for col in ("name", "kind", "version", "status"):
        table.add_column(col)
    for i in infos:
        status = f"[red]failed: {i.error}[/red]" if i.error else "[green]loaded[/green]"
        table.add_row(i.name, i.kind, i.version or "-", status)
    Console().print(table)


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("plugins")(plugins_command)
