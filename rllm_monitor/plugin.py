"""`rllm view` (and `rllm plot`, from rllm_monitor.plot): the monitor's CLI commands, registered by hook."""

from __future__ import annotations

import importlib
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import RLLMError
from rllm_core.hookspecs import hookimpl
from rllm_core.stop_signal import wait_for_stop_signal

__all__ = ["rllm_register_commands", "view_command"]

DEFAULT_PORT = 8420


def view_command(
    path: Path = typer.Argument(..., help="A run directory (the --output of `rllm train` / `rllm eval`) or a "
                                          "folder of runs."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="Port to listen on; 0 picks a free one."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; anything but this machine "
                                                          "(127.0.0.1, localhost, ::1) needs --token."),
    token: str | None = typer.Option(None, "--token", help="A secret every request must carry (the printed URL "
                                                           "has it); required with a non-local --host."),
    open_browser: bool = typer.Option(True, "--open/--no-open", help="Open the page in a browser."),
) -> None:
    """Watch runs in the browser: curves (live while a run writes), episodes, tokens, zero-reward diagnosis."""
    from rllm_monitor.server import start_view_server

    console = Console()
    try:
        server = start_view_server(path, host=host, port=port, token=token)
    except RLLMError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    with server:
        console.print(f"rllm view: {escape(str(path))} at {server.page_url} (Ctrl-C stops)", soft_wrap=True,
                      highlight=False)
        if open_browser:
            _open(server.page_url)
        wait_for_stop_signal()
        console.print("stopped", highlight=False)


def _open(url: str) -> None:
    """Open the page if a browser is there; a headless machine just keeps the printed URL."""
    try:
        import webbrowser

        webbrowser.open(url, new=2)
    except Exception:
        pass


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("view")(view_command)
    try:  # `rllm plot` lives in its own module (M4); a checkout without it still has `rllm view`
        plot = importlib.import_module("rllm_monitor.plot")
    except ModuleNotFoundError as exc:
        if exc.name != "rllm_monitor.plot":
            raise
        return
    plot.register_plot(app)
