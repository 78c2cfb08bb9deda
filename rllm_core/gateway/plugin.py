"""`rllm gateway`: run the recording reverse proxy in the foreground, in front of one or more upstreams."""

from __future__ import annotations

import threading

import typer
from pydantic import ValidationError
from rich.console import Console

from rllm_core.errors import ConfigError
from rllm_core.hookspecs import hookimpl

__all__ = ["gateway_command", "upstream_warnings"]


def upstream_warnings(urls: list[str]) -> list[str]:
    """An upstream without /v1 is accepted (some APIs mount elsewhere), but it is usually a slip whose
    only symptom would be a 404 on every call, so it is named at startup."""
    return [f"upstream {u} does not end in /v1; calls go to {u.rstrip('/')}/chat/completions, which most "
            "OpenAI-compatible servers do not have" for u in urls if not u.rstrip("/").endswith("/v1")]


def gateway_command(
    upstream: list[str] = typer.Option(..., "--upstream", help="Upstream base URL ending in /v1 (repeatable)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; 127.0.0.1 unless you mean it."),
    port: int = typer.Option(8080, "--port", help="Port to listen on (0 = a free one)."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="RLLM_GATEWAY_API_KEY",
                                       help="Require 'Authorization: Bearer KEY' from clients."),
    upstream_api_key: str | None = typer.Option(None, "--upstream-api-key", envvar="RLLM_UPSTREAM_API_KEY",
                                                help="Bearer token sent upstream (never logged or stored)."),
    inject: bool | None = typer.Option(
        None, "--inject/--no-inject",
        help="Add logprobs/return_token_ids to every request (--inject: e.g. vLLM on another host) or never "
             "(--no-inject: hosted APIs). Default: only for loopback upstreams."),
    tokenizer: str | None = typer.Option(None, "--tokenizer",
                                         help="HF tokenizer path to retokenize replies that carry no ids."),
    timeout_s: float = typer.Option(600.0, "--timeout", help="Seconds to wait on the upstream."),
    max_body_bytes: int | None = typer.Option(None, "--max-body-bytes", min=1,
                                              help="Largest request body accepted, larger is HTTP 400 "
                                                   "[default: 32 MiB]."),
) -> None:
    """Serve an OpenAI-compatible gateway that records every call (GET /sessions/ID/steps to read them)."""
    from rllm_core.capture.request import is_loopback
    from rllm_core.gateway.config import DEFAULT_MAX_BODY_BYTES, UpstreamConfig  # late: keeps `rllm --help` light
    from rllm_core.gateway.server import start_gateway

    console = Console(stderr=True, soft_wrap=True)  # one line per message, even piped (no wrap at 80 columns)
    try:
        ups = [UpstreamConfig(url=u, api_key=upstream_api_key, inject_token_ids=inject,
                              tokenizer=tokenizer, timeout_s=timeout_s) for u in upstream]
        handle = start_gateway(ups, host=host, port=port, api_key=api_key,
                               max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES)
    except ValidationError as exc:
        problems = "; ".join(str(e.get("ctx", {}).get("error") or e["msg"]) for e in exc.errors())
        console.print(f"[red]rllm gateway: {problems}[/red]", highlight=False)
        raise typer.Exit(2) from None
    except ConfigError as exc:
        console.print(f"[red]rllm gateway: {exc}[/red]", highlight=False)
        raise typer.Exit(2) from None
    for warning in upstream_warnings([u.url for u in ups]):
        console.print(f"[yellow]warning: {warning}[/yellow]", highlight=False)
    if not api_key and not is_loopback(f"http://[{host}]" if ":" in host else f"http://{host}"):
        console.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach this port "
                      "can use the upstream and read recorded calls[/yellow]", highlight=False)
    console.print(f"rllm gateway on [bold]{handle.url}[/bold] → {', '.join(u.url for u in ups)}; "
                  f"sessions at {handle.url}/sessions/<id>/v1 (Ctrl-C to stop)")
    typer.echo(handle.url, err=False)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("gateway")(gateway_command)
