"""The `rllm` command line: one typer app; plugins add their commands through `rllm_register_commands`."""

from rllm.cli.app import build_app, main

__all__ = ["build_app", "main"]
