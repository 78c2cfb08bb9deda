"""`rllm harness install NAME ...` and `rllm harness list`: the CLI agents rllm can run, and installing them."""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rllm_core.harness import HarnessError, get_harness, get_harnesses

__all__ = ["harness_app"]

harness_app = typer.Typer(help="CLI coding agents run unchanged in a sandbox (`--harness NAME`).",
                          no_args_is_help=True)


@harness_app.command("list")
def list_command() -> None:
    """The known harnesses: the API each speaks, its pinned package, and whether it is installed."""
    table = Table(title="harnesses")
    for col in ("name", "api", "installed"):
        table.add_column(col, overflow="fold")
    for name in sorted(get_harnesses()):
        harness = get_harness(name)
        copy = harness.installed()
        table.add_row(escape(name), harness.api, f"[green]{escape(copy.version)}[/green]" if copy else
                      "[yellow]no[/yellow]")
    Console().print(table)


@harness_app.command("install")
def install_command(
    names: list[str] = typer.Argument(None, help="Harness names (`rllm harness list`)."),
    all_: bool = typer.Option(False, "--all", help="Install every known harness."),
) -> None:
    """Install harnesses the way their users do (npm or pip, pinned), into $RLLM_HOME/harnesses."""
    chosen = sorted(get_harnesses()) if all_ else list(names or [])
    if not chosen:
        typer.secho("error: name a harness (`rllm harness list`) or pass --all", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    failed = False
    for name in chosen:
        try:
            harness = get_harness(name)
            start = time.monotonic()
            copy = harness.installed() or harness.install()
            typer.echo(f"{name} {copy.version}: {copy.home} ({time.monotonic() - start:.1f} s)")
        except HarnessError as exc:
            failed = True
            typer.secho(f"error: {name}: {exc}", fg=typer.colors.RED, err=True)
            if exc.tail:
                typer.echo(exc.tail, err=True)
        except Exception as exc:
            failed = True
            typer.secho(f"error: {name}: {exc}", fg=typer.colors.RED, err=True)
    if failed:
        raise typer.Exit(1)
