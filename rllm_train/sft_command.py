"""`rllm sft DATA... --model M -o RUN`: supervised fine-tuning from the command line (rllm_train.sft)."""

from __future__ import annotations

import shlex

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import RLLMError
from rllm_core.hookspecs import hookimpl

__all__ = ["rllm_register_commands", "sft_command"]

_DATA = "Data"
_MODEL = "Model and backend"
_OPT = "Optimizer and schedule"


def sft_command(
    data: list[str] = typer.Argument(..., help="Runs of rllm eval / train, episodes .jsonl, or chat .jsonl "
                                     "({\"messages\": [...]} per line)."),
    model: str = typer.Option("smollm2-135m", "--model", help="Model to start from (a name, a directory, a run).",
                              rich_help_panel=_MODEL),
    output: str = typer.Option("runs/sft", "--output", "-o", help="Run directory to write.", rich_help_panel=_MODEL),
    backend: str = typer.Option("local", "--backend", help="local, verl or tinker.", rich_help_panel=_MODEL),
    device: str = typer.Option("cpu", "--device", rich_help_panel=_MODEL),
    lora_rank: int = typer.Option(0, "--lora-rank", help="LoRA rank (0: full fine-tune).", rich_help_panel=_MODEL),
    roles: str | None = typer.Option(None, "--roles", help="A LoRA adapter per role: 'solver=lora:solver,...'.",
                                     rich_help_panel=_MODEL),
    min_reward: float | None = typer.Option(None, "--min-reward", help="Keep episodes scoring at least this.",
                                            rich_help_panel=_DATA),
    reason: list[str] = typer.Option([], "--reason", help="Keep episodes with this reward reason (repeatable).",
                                     rich_help_panel=_DATA),
    benchmark: list[str] = typer.Option([], "--benchmark", help="Keep episodes of this benchmark (repeatable).",
                                        rich_help_panel=_DATA),
    role: list[str] = typer.Option([], "--role", help="Keep trajectories of this role (repeatable).",
                                   rich_help_panel=_DATA),
    where: str | None = typer.Option(None, "--where", help="Keep episodes where this Python expression over "
                                     "`episode` holds.", rich_help_panel=_DATA),
    epochs: int = typer.Option(1, "--epochs", rich_help_panel=_OPT),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop after N steps.", rich_help_panel=_OPT),
    batch_size: int = typer.Option(8, "--batch-size", help="Rows per step.", rich_help_panel=_OPT),
    micro_batch_size: int = typer.Option(8, "--micro-batch-size", rich_help_panel=_OPT),
    max_seq_len: int = typer.Option(2048, "--max-seq-len", rich_help_panel=_OPT),
    lr: float = typer.Option(1e-5, "--lr", rich_help_panel=_OPT),
    warmup_steps: int = typer.Option(0, "--warmup-steps", rich_help_panel=_OPT),
    lr_schedule: str = typer.Option("constant", "--lr-schedule", help="constant, linear or cosine.",
                                    rich_help_panel=_OPT),
    seed: int = typer.Option(0, "--seed", rich_help_panel=_OPT),
    save_every: int = typer.Option(0, "--save-every", help="Also checkpoint every N steps.", rich_help_panel=_OPT),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the progress bar."),
) -> None:
    """Fine-tune on curated episodes or chat data (the loss on assistant tokens only)."""
    from rllm_train.sft import SftConfig, sft
    from rllm_train.sft_data import EpisodeFilter

    console = Console()
    try:
        config = SftConfig(
            data=data, model=model, output=output, backend=backend, device=device, lora_rank=lora_rank,
            roles=roles or {},
            keep=EpisodeFilter(min_reward=min_reward, reasons=reason, benchmarks=benchmark, roles=role, where=where),
            epochs=epochs, max_steps=max_steps, batch_size=batch_size, micro_batch_size=micro_batch_size,
            max_seq_len=max_seq_len, lr=lr, warmup_steps=warmup_steps, lr_schedule=lr_schedule, seed=seed,
            save_every=save_every)
        console.print(f"[bold]rllm sft[/bold] {len(data)} source(s) · model {model} · backend {backend} → "
                      f"{escape(output)}", soft_wrap=True, highlight=False)
        result = sft(config, progress=progress, console=console)
    except ValidationError as exc:
        first = exc.errors()[0]
        console.print(f"[red]error:[/red] {'.'.join(map(str, first['loc']))}: {escape(first['msg'])}",
                      soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    except RLLMError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    run = shlex.quote(str(result.run_dir))
    console.print(f"done: {result.steps_done} steps, checkpoint {result.last_checkpoint}\n  next: rllm train "
                  f"BENCHMARK --init {run}   ·   rllm eval BENCHMARK --model {run}", highlight=False,
                  soft_wrap=True, markup=False)


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("sft")(sft_command)
