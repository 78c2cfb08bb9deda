"""`rllm gateway`: run the recording reverse proxy in the foreground, in front of one or more upstreams."""

from __future__ import annotations

import secrets

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import ConfigError
from rllm_core.hookspecs import hookimpl
from rllm_core.stop_signal import wait_for_stop_signal

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
                                       help="The token clients must send ('Authorization: Bearer KEY') "
                                            "[default: a random one, printed]."),
    no_auth: bool = typer.Option(False, "--no-auth",
                                 help="Accept clients without a token; only on a loopback --host (any local "
                                      "process may then spend the upstream's key)."),
    store: str = typer.Option("memory", "--store",
                              help="Where recorded Steps are kept: 'memory', or 'sqlite:PATH' to survive a "
                                   "restart of the gateway on the same file."),
    session_ttl_s: float = typer.Option(3600.0, "--session-ttl", min=0.001,
                                        help="Seconds an untaken session may sit idle before it is dropped."),
    max_default_steps: int = typer.Option(10_000, "--max-default-steps", min=1,
                                          help="Steps kept for calls that name no session (oldest dropped)."),
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
    """Serve an OpenAI-compatible gateway that records every call (GET /sessions/ID/steps to read them).

    An agent needs only a session URL (printed; its signature is the credential): any key it sends, or none,
    works. Reading or closing sessions needs the token (printed, or --api-key). Only chat/completions,
    completions, responses and models reach the upstream."""
    from rllm_rollout.gateway.config import DEFAULT_MAX_BODY_BYTES, StoreLimits, UpstreamConfig  # late: light --help
    from rllm_rollout.gateway.server import start_gateway

    console = Console(stderr=True, soft_wrap=True)  # one line per message, even piped (no wrap at 80 columns)
    try:
        ups = [UpstreamConfig(url=u, api_key=upstream_api_key, inject_token_ids=inject,
                              tokenizer=tokenizer, timeout_s=timeout_s) for u in upstream]
        if no_auth and api_key:
            raise ConfigError("--no-auth and --api-key (or RLLM_GATEWAY_API_KEY) contradict: pass one")
        limits = StoreLimits(session_ttl_s=session_ttl_s, max_default_steps=max_default_steps)
        handle = start_gateway(ups, host=host, port=port, api_key=api_key, auth=not no_auth,
                               max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES, store=store, limits=limits)
    except ValidationError as exc:
        problems = "; ".join(str(e.get("ctx", {}).get("error") or e["msg"]) for e in exc.errors())
        console.print(f"[red]rllm gateway: {escape(problems)}[/red]", highlight=False)
        raise typer.Exit(2) from None
    except ConfigError as exc:
        console.print(f"[red]rllm gateway: {escape(str(exc))}[/red]", highlight=False)
        raise typer.Exit(2) from None
    for warning in upstream_warnings([u.url for u in ups]):
        console.print(f"[yellow]warning: {escape(warning)}[/yellow]", highlight=False)
    token = handle.client_api_key
    if token is None:
        console.print("[yellow]warning: --no-auth: any process on this machine can use the upstream and read "
                      "recorded calls[/yellow]", highlight=False)
    elif not api_key:
        console.print(f"client token (generated; choose one with --api-key or RLLM_GATEWAY_API_KEY): {token}",
                      highlight=False)
    ready = handle.session_base_url(f"session-{secrets.token_hex(4)}")
    console.print(f"rllm gateway on [bold]{handle.url}[/bold] → {', '.join(u.url for u in ups)}; store {store} "
                  "(Ctrl-C to stop)", highlight=False)
    console.print(f"an agent's base_url, any API key or none (its calls are recorded under that session): {ready}"
                  + ("; mint more with RemoteGateway(url, token).session_base_url(NAME)" if token else ""),
                  highlight=False)
    typer.echo(handle.url, err=False)  # stdout, for scripts: line 1 the URL, line 2 the token, then a session URL
    if token is not None:
        typer.echo(token, err=False)
    typer.echo(ready, err=False)
    try:
        wait_for_stop_signal()
    finally:
        handle.stop()


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("gateway")(gateway_command)
