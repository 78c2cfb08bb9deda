"""`rllm export RUN_OR_CHECKPOINT -o DIR`: the command, and the Hub upload behind `--push-to-hub`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import RLLMError
from rllm_core.hookspecs import hookimpl

__all__ = ["export_command", "push_to_hub", "rllm_register_commands"]


def export_command(
    run: str = typer.Argument(..., help="A run directory, RUN:step_N, or a checkpoint directory."),
    out: Path = typer.Option(..., "--output", "-o", help="Folder to write (must be new or empty)."),
    step: int | None = typer.Option(None, "--step", help="Checkpoint step (default: the newest)."),
    fmt: str = typer.Option("hf", "--format", help="hf (safetensors, config, tokenizer) or gguf."),
    merge_lora: bool = typer.Option(False, "--merge-lora", help="Merge a LoRA run's adapter into its base."),
    role: str | None = typer.Option(None, "--role", help="With --roles runs: the role whose adapter to export."),
    dtype: str | None = typer.Option(None, "--dtype", help="float32, float16 or bfloat16 (default: as trained)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --output folder."),
    push_to_hub: str | None = typer.Option(None, "--push-to-hub", metavar="REPO",
                                           help="Also upload the folder to this Hugging Face repo."),
) -> None:
    """Export a trained run as a model: Hugging Face layout (transformers, vLLM) or GGUF (llama.cpp, Ollama)."""
    from rllm_train.export import export_checkpoint

    console = Console(stderr=True, soft_wrap=True)
    try:
        if push_to_hub:
            _hub_ready()  # before writing anything: an offline machine learns it at once
        with console.status(f"exporting {run} ..."):
            result = export_checkpoint(run, out, step=step, merge_lora=merge_lora, role=role, dtype=dtype,
                                       fmt=fmt, force=force)
        if push_to_hub:
            push_to_hub_folder(out, push_to_hub)
    except RLLMError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    size = sum(f.stat().st_size for f in result.files) / 2**20
    console.print(f"exported {result.checkpoint} ({result.what}) → {out}: {len(result.files)} files, "
                  f"{size:.0f} MiB", highlight=False)
    typer.echo(str(out))


def _hub_ready() -> None:
    import os

    from rllm_core.errors import ConfigError
    from rllm_rollout.benchmarks.data import hub_unreachable

    offline = [v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
               if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")]
    if (why := f"{offline[0]} is set" if offline else hub_unreachable()) is not None:
        raise ConfigError(f"--push-to-hub needs the Hugging Face Hub, and {why}; export without it and upload "
                          "the folder later (huggingface-cli upload REPO DIR)")


def push_to_hub_folder(folder: Path, repo: str) -> None:
    """Upload `folder` to the Hub repo `repo` (created if missing) with huggingface_hub."""
    from huggingface_hub import HfApi

    _hub_ready()
    api = HfApi()
    api.create_repo(repo, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo)


push_to_hub = push_to_hub_folder


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("export")(export_command)
