"""`rllm bench list` and `rllm bench show`: what can be evaluated or trained on, and what a task looks like."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from rllm_core.errors import RLLMError
from rllm_rollout.benchmarks.data import DATA_DIR_ENV, resolve_data_dir
from rllm_rollout.benchmarks.registry import get_benchmark, list_benchmarks

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks: list them, look at one.", no_args_is_help=True, add_completion=False)

_DATA_DIR = typer.Option(None, "--data-dir", help=f"Folder of benchmark files (default: ${DATA_DIR_ENV}).")


def _use_data_dir(data_dir: Path | None) -> None:
    """Point the file-backed benchmarks at `data_dir`; a folder that is not there is an error, not a list of
    benchmarks silently marked "hub"."""
    try:
        resolve_data_dir(data_dir)
    except RLLMError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if data_dir is not None:
        os.environ[DATA_DIR_ENV] = str(data_dir)


@bench_app.command("list")
def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
    offline_only: bool = typer.Option(False, "--offline", help="Only benchmarks that run here without the Hub."),
    category: str | None = typer.Option(None, "--category", help="Only this category (math, code, reasoning, ...)."),
    data_dir: Path | None = _DATA_DIR,
) -> None:
    """List benchmarks: name, category, rows, reward, and whether each runs offline here."""
    _use_data_dir(data_dir)
    rows = [b.info() for b in list_benchmarks()]
    rows = [r for r in rows if (not offline_only or r["offline"]) and (category is None or r["category"] == category)]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"rllm benchmarks ({len(rows)}, {sum(r['offline'] for r in rows)} offline here)")
    for col in ("name", "category", "rows", "reward", "offline"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for r in rows:
        table.add_row(r["name"], r["category"], "-" if r["rows"] is None else str(r["rows"]), r["reward"],
                      "[green]yes[/green]" if r["offline"] else "[dim]hub[/dim]")
    Console().print(table)


@bench_app.command("show")
def show_command(
    name: str = typer.Argument(..., help="Benchmark name."),
    split: str = typer.Option("test", "--split"),
    data_dir: Path | None = _DATA_DIR,
) -> None:
    """Show a benchmark's details and its first task."""
    _use_data_dir(data_dir)
    try:
        bench = get_benchmark(name)
        typer.echo(json.dumps(bench.info(), indent=2))
        task = bench.load(split=split, max_examples=1)[0]
    except RLLMError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo(f"\n--- first task ({task.id}) ---\n{task.instruction}\n--- gold ---\n{task.ground_truth}")
