"""`rllm serve`: the local policy server (or vLLM) in the foreground, its URL printed on stdout."""

from __future__ import annotations

import threading
from enum import StrEnum
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from rllm_core.errors import RLLMError
from rllm_core.hookspecs import hookimpl

if TYPE_CHECKING:
    from rllm_backends.local_torch.serving.server import RunningPolicyServer
    from rllm_backends.local_torch.serving.vllm import VLLMServer

__all__ = ["serve_command"]


class Engine(StrEnum):
    torch = "torch"
    vllm = "vllm"


class DType(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


def serve_command(
    model: str = typer.Option("smollm2-135m", "--model", "-m",
                              help="smollm2-135m (embedded), tiny-random (tests), a local dir or a HF id."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; 127.0.0.1 unless you mean it."),
    port: int = typer.Option(0, "--port", help="Port to listen on (0 = a free one, printed)."),
    engine: Engine = typer.Option(Engine.torch, "--engine", help="torch: in-process; vllm: launch `vllm serve`."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch intra-op threads (default: torch's)."),
    max_batch_size: int = typer.Option(32, "--max-batch-size", min=1, help="Most sequences decoded together."),
    dtype: DType = typer.Option(DType.float32, "--dtype", help="Weights dtype for the torch engine."),
    device: str = typer.Option("cpu", "--device", help="torch device, e.g. cpu or cuda:0."),
    vllm_arg: list[str] = typer.Option([], "--vllm-arg", help="Extra argument passed to `vllm serve` (repeatable)."),
) -> None:
    """Serve a model OpenAI-compatibly with token ids and logprobs, for rollouts and training."""
    console = Console(stderr=True)
    try:
        handle = _start(model, host, port, engine, threads, max_batch_size, dtype, device, vllm_arg, console)
    except RLLMError as exc:
        console.print(f"[red]rllm serve: {exc}[/red]")
        raise typer.Exit(2) from None
    from rllm_backends.local_torch.serving.vllm import gateway_hint

    console.print(f"serving [bold]{handle.model_name}[/bold] at [bold]{handle.base_url}[/bold] "
                  f"(engine {engine.value}; Ctrl-C to stop)\nrecord calls through the gateway with:\n  "
                  f"{gateway_hint(handle.base_url)}")
    typer.echo(handle.base_url)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()


def _start(model: str, host: str, port: int, engine: Engine, threads: int | None, max_batch_size: int,
           dtype: DType, device: str, vllm_args: list[str], console: Console) -> RunningPolicyServer | VLLMServer:
    if engine is Engine.vllm:
        from rllm_backends.local_torch.serving.vllm import VLLMServer

        server = VLLMServer(model, host, port, extra_args=vllm_args)
        console.print(f"starting: {' '.join(server.command)}")
        return server.start()
    import torch

    from rllm_backends.local_torch.serving import load_model, start_policy_server

    with console.status(f"loading {model} ..."):
        loaded = load_model(model, dtype=getattr(torch, dtype.value), device=device)
    return start_policy_server(loaded, host=host, port=port, max_batch_size=max_batch_size, threads=threads)


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
