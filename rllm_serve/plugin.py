"""`rllm serve`: the local policy server (or vLLM) in the foreground, its URL printed on stdout."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import ConfigError, RLLMError
from rllm_core.hookspecs import hookimpl
from rllm_core.stop_signal import wait_for_stop_signal

if TYPE_CHECKING:
    from rllm_serve.server import RunningPolicyServer
    from rllm_serve.vllm import VLLMServer

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
    max_batch_size: int | None = typer.Option(None, "--max-batch-size", min=1,
                                              help="Most sequences decoded together (torch default 32; vLLM's "
                                                   "--max-num-seqs)."),
    dtype: DType | None = typer.Option(None, "--dtype", help="Weights dtype (torch engine: bfloat16 where the "
                                                            "CPU/GPU computes it natively, else float32; vLLM: "
                                                            "its own default)."),
    device: str = typer.Option("cpu", "--device", help="torch device, e.g. cpu or cuda:0 (torch engine)."),
    vllm_arg: list[str] = typer.Option([], "--vllm-arg", help="Extra argument passed to `vllm serve` (repeatable)."),
    kv_cache_gb: float | None = typer.Option(None, "--kv-cache-gb", min=0.001,
                                             help="KV cache pool size in GB (torch engine; default 1.0, capped at "
                                                  "what max-batch-size rows at full context can use)."),
    swap_mode: str = typer.Option("finish", "--swap-mode",
                                  help="What a weight update does to requests in flight (torch engine): finish "
                                       "them on the old weights (kept in a copy), or resume them on the new ones."),
    admin_token: str | None = typer.Option(None, "--admin-token", envvar="RLLM_SERVE_ADMIN_TOKEN",
                                           help="Accept new weights (PUT /admin/weights) from a trainer that "
                                                "sends this token (torch engine)."),
) -> None:
    """Serve a model OpenAI-compatibly with token ids and logprobs, for rollouts and training."""
    console = Console(stderr=True, soft_wrap=True)  # one line per message, even piped (no wrap at 80 columns)
    try:
        if swap_mode not in ("finish", "resume"):
            raise ConfigError(f"--swap-mode must be finish or resume, got {swap_mode!r}")
        if admin_token is not None and engine is Engine.vllm:
            raise ConfigError("--admin-token is the torch engine's weight route; vLLM takes weights its own way")
        handle = _start(model, host, port, engine, threads, max_batch_size, dtype, device, vllm_arg, console,
                        kv_cache_gb, swap_mode, admin_token)
    except RLLMError as exc:
        console.print(f"[red]rllm serve: {escape(str(exc))}[/red]", highlight=False)  # "rllm[x]" is no tag
        raise typer.Exit(2) from None
    from rllm_serve.vllm import gateway_hint

    console.print(f"serving [bold]{handle.model_name}[/bold] at [bold]{handle.base_url}[/bold] "
                  f"(engine {engine.value}; Ctrl-C to stop)\nrecord calls through the gateway with:\n  "
                  f"{gateway_hint(handle.base_url)}")
    typer.echo(handle.base_url)
    try:
        wait_for_stop_signal()
        console.print("rllm serve: stopping (signal received)", highlight=False)  # so a log says why it ended
    finally:
        handle.stop()


def _start(model: str, host: str, port: int, engine: Engine, threads: int | None, max_batch_size: int | None,
           dtype: DType | None, device: str, vllm_args: list[str], console: Console,
           kv_cache_gb: float | None = None, swap_mode: str = "finish",
           admin_token: str | None = None) -> RunningPolicyServer | VLLMServer:
    if engine is Engine.vllm:
        from rllm_serve.vllm import VLLMServer

        extra = [*(["--dtype", dtype.value] if dtype else []),
                 *(["--max-num-seqs", str(max_batch_size)] if max_batch_size else []), *vllm_args]
        server = VLLMServer(model, host, port, served_model_name=model, extra_args=extra)
        console.print(f"starting: {' '.join(server.command)}")
        return server.start()
    import torch

    from rllm_core.cpu_features import matmul_flags
    from rllm_serve import load_model, start_policy_server
    from rllm_serve.models import default_dtype

    if dtype is None:
        chosen, why = default_dtype(device)
        console.print(f"dtype {str(chosen).removeprefix('torch.')}: {why} (CPU flags: {matmul_flags()}); "
                      "--dtype overrides", highlight=False)
    else:
        chosen = getattr(torch, dtype.value)
    with console.status(f"loading {model} ..."):
        loaded = load_model(model, dtype=chosen, device=device)
    return start_policy_server(loaded, host=host, port=port, max_batch_size=max_batch_size or 32, threads=threads,
                               kv_cache_gb=kv_cache_gb, swap_mode=swap_mode,  # type: ignore[arg-type]
                               own_model=True, admin_token=admin_token or None)


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
