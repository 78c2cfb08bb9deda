"""`rllm plugins`: what was loaded (name, kind, version), what failed to load, and for each framework adapter
whether its framework is installed in a tested version."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rllm_core.adapters import AdapterSpec, get_adapters
from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import get_plugin_manager

__all__ = ["adapter_status", "plugins_command"]


def adapter_status(spec: AdapterSpec) -> tuple[str | None, str]:
    """(installed framework version, status): 'ok', 'not installed (pip install "rllm[extra]")' or 'untested'."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        installed = version(spec.framework)
    except PackageNotFoundError:
        hint = f' (pip install "rllm[{spec.extra}]")' if spec.extra else ""
        return None, f"not installed{hint}"
    if not spec.tested_versions:
        return installed, "ok"
    try:
        in_range = installed in SpecifierSet(spec.tested_versions)
    except InvalidSpecifier:
        return installed, f"tested range {spec.tested_versions!r} is not a version specifier"
    return installed, "ok" if in_range else f"untested version (tested: {spec.tested_versions})"


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
        status = f"[red]failed: {escape(i.error)}[/red]" if i.error else "[green]loaded[/green]"
        table.add_row(*_plain(i.name, i.kind, i.version or "-"), status)
    console = Console()
    console.print(table)
    adapters = Table(title="framework adapters")
    for col in ("adapter", "framework", "installed", "tested", "status"):
        adapters.add_column(col, overflow="fold")  # at 80 columns a long name folds, never ends in "…"
    hints: list[str] = []
    for spec in get_adapters(get_plugin_manager()):
        installed, status = adapter_status(spec)
        colour = "green" if status == "ok" else "yellow"
        short, _, hint = status.partition(" (pip install ")
        if hint:  # the install command goes under the table, whole, where a narrow terminal cannot cut it
            hints.append(f"  {spec.name}: pip install {hint.removesuffix(')')}")
        adapters.add_row(*_plain(spec.name, spec.framework, installed or "-", spec.tested_versions or "-"),
                         f"[{colour}]{escape(short)}[/{colour}]")
    console.print(adapters)
    _print_harnesses(console)
    if hints:
        console.print("to install a missing framework:", highlight=False)
        for line in hints:
            console.print(escape(line), highlight=False, soft_wrap=True)  # "rllm[extra]" is not a tag


def _print_harnesses(console: Console) -> None:
    """The CLI agents `--harness` runs, and whether each is installed (else the command that installs it)."""
    from rllm_core.harness import get_harnesses

    table = Table(title="harnesses (--harness)")
    for col in ("harness", "api", "installed"):
        table.add_column(col, overflow="fold")
    missing = []
    for name, spec in sorted(get_harnesses(get_plugin_manager()).items()):
        try:
            harness = spec.factory()
            copy = harness.installed()
        except Exception as exc:  # a third party's broken harness: shown, not fatal
            table.add_row(*_plain(name, "-"), f"[red]failed: {escape(str(exc))}[/red]")
            continue
        if copy is None:
            missing.append(name)
        table.add_row(*_plain(name, harness.api), f"[green]{escape(copy.version)}[/green]" if copy
                      else "[yellow]not installed[/yellow]")
    console.print(table)
    if missing:
        console.print(escape(f"to install: rllm harness install {' '.join(missing)}"), highlight=False)


def _plain(*cells: str) -> list[str]:
    """Cells as literal text: rich reads a table cell as markup, so `rllm[autogen]` (an extra, a plugin's own
    name or version) would print as `rllm` without this."""
    return [escape(c) for c in cells]


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("plugins")(plugins_command)
