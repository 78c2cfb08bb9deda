"""`rllm model setup` / `rllm model show`: which model `rllm eval` (and friends) talk to when not told.

Three kinds: the embedded local model (started on demand by the local policy server), a local/vLLM server
URL, or an OpenAI-compatible API. Stored as JSON at `$RLLM_HOME/config.json`, else
`$XDG_CONFIG_HOME/rllm/config.json` (default `~/.config/rllm/config.json`). API keys are read from a named
environment variable at run time; a key is written to the file only with `--store-key`, and then the file
is made readable by its owner only.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

import typer
from pydantic import BaseModel, ConfigDict, ValidationError

from rllm_core.errors import ConfigError, UpstreamError
from rllm_core.net import check_reachable

__all__ = ["ModelConfig", "config_path", "load_model_config", "model_app", "save_model_config"]

Kind = Literal["embedded", "server", "api"]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_EMBEDDED = "smollm2-135m"


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Kind = "embedded"
    model: str = DEFAULT_EMBEDDED
    """Embedded: a built-in name (smollm2-135m, tiny-random) or a local HF path; otherwise the served model id."""
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = None
    """Only set when the user asked to store the key in clear (`--store-key`)."""

    def check(self) -> ModelConfig:
        if self.kind in ("server", "api") and not self.base_url:
            raise ConfigError(f"model kind {self.kind!r} needs a base URL (e.g. http://127.0.0.1:8000/v1): --base-url")
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base URL {self.base_url!r} must start with http:// or https://")
        if self.api_key_env and not _ENV_NAME.match(self.api_key_env):
            raise ConfigError(f"{self.api_key_env!r} is not an environment variable name (letters, digits, _)")
        return self

    def resolve_api_key(self) -> str | None:
        """The key from the named environment variable, else the stored one, else None."""
        if self.api_key_env and os.environ.get(self.api_key_env):
            return os.environ[self.api_key_env]
        return self.api_key


def config_path() -> Path:
    home = os.environ.get("RLLM_HOME")
    if home:
        return Path(home).expanduser() / "config.json"
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg).expanduser() / "rllm" / "config.json"


def _read_all(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"rllm config {path} cannot be read ({exc}); fix or delete it, then run `rllm model setup`"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"rllm config {path} must hold a JSON object; delete it and run `rllm model setup`")
    return data


def load_model_config() -> ModelConfig | None:
    """The saved model config, or None when `rllm model setup` was never run."""
    path = config_path()
    section = _read_all(path).get("model")
    if section is None:
        return None
    try:
        return ModelConfig.model_validate(section).check()
    except ValidationError as exc:
        raise ConfigError(f"the 'model' section of {path} is invalid: {exc}. Run `rllm model setup` again.") from exc


def save_model_config(cfg: ModelConfig) -> Path:
    path = config_path()
    data = _read_all(path)
    data["model"] = cfg.check().model_dump(exclude_none=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written to a new file that is owner-only from its first byte when it holds a key (chmod after
    # writing would leave it readable for a moment), then moved over the old one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if cfg.api_key else 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        if cfg.api_key:
            os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _describe(cfg: ModelConfig) -> dict[str, Any]:
    out = cfg.model_dump(exclude={"api_key"})
    if cfg.api_key_env:
        out["api_key"] = f"from ${cfg.api_key_env} ({'set' if os.environ.get(cfg.api_key_env) else 'NOT set'})"
    elif cfg.api_key:
        out["api_key"] = "stored in the config file (****" + cfg.api_key[-4:] + ")"
    else:
        out["api_key"] = None
    return out


def _probe_server(base_url: str) -> tuple[list[str], str | None]:
    """The models a server lists, and why it could not be asked (None when it answered). Setup saves either
    way (the server may start later), but it says so now rather than at the first `rllm eval`."""
    try:
        return check_reachable(base_url, timeout_s=3.0), None
    except UpstreamError as exc:
        return [], str(exc.__cause__ or exc).split("\n")[0]


model_app = typer.Typer(help="Choose the model rllm uses by default.", no_args_is_help=True, add_completion=False)


@model_app.command("setup")
def setup_command(
    kind: str | None = typer.Option(None, "--kind", help="embedded | server | api (prompted when omitted)."),
    model: str | None = typer.Option(None, "--model", help="Model name (embedded: smollm2-135m, tiny-random)."),
    base_url: str | None = typer.Option(None, "--base-url", help="Server / API base URL ending in /v1."),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="Environment variable holding the API key."),
    store_key: bool = typer.Option(False, "--store-key", help="Store the key itself in the config (owner-only file)."),
) -> None:
    """Pick the default model: the embedded local model, a local/vLLM server URL, or an OpenAI-compatible API."""
    interactive = sys.stdin.isatty() or kind is None
    if kind is None:
        typer.echo("Which model should rllm use?\n  1) embedded  local SmolLM2-135M, no server needed\n"
                   "  2) server    a local or vLLM server URL\n  3) api       an OpenAI-compatible API")
        answer = typer.prompt("Choose", default="1")
        kind = {"1": "embedded", "2": "server", "3": "api"}.get(answer.strip(), answer.strip())
    if kind not in ("embedded", "server", "api"):
        typer.secho(f"error: --kind must be embedded, server or api (got {kind!r})", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    if kind != "embedded" and base_url is None and interactive:
        default = "http://127.0.0.1:8000/v1" if kind == "server" else "https://api.openai.com/v1"
        base_url = typer.prompt("Base URL", default=default)
    served, unreachable = _probe_server(base_url) if kind == "server" and base_url else ([], None)
    if model is None:
        default = DEFAULT_EMBEDDED if kind == "embedded" else (served[0] if served else "default")
        hint = " (smollm2-135m, tiny-random, or a local HF model folder)" if kind == "embedded" else ""
        hint = f" (it serves {', '.join(served[:5])})" if served else hint
        model = typer.prompt(f"Model name{hint}", default=default) if interactive else default
    api_key: str | None = None
    if kind == "api" and api_key_env is None and interactive and not store_key:
        api_key_env = typer.prompt("Environment variable with the API key", default="OPENAI_API_KEY")
    if store_key:
        api_key = os.environ.get(api_key_env) if api_key_env else None
        if api_key is None:
            api_key = typer.prompt("API key (stored in the config file)", hide_input=True)
    try:
        cfg = ModelConfig(kind=kind, model=model, base_url=base_url, api_key_env=api_key_env,  # type: ignore[arg-type]
                          api_key=api_key)
        path = save_model_config(cfg)
    except ConfigError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo(f"saved to {path}")
    if served and cfg.model not in served:
        typer.secho(f"note: {base_url} does not list {cfg.model!r} (it serves {', '.join(served[:5])}); "
                    "calls may be refused", fg=typer.colors.YELLOW)
    if unreachable:
        typer.secho(f"note: could not list the models at {base_url} ({unreachable}); if the server is not up "
                    "yet, start it before running rllm (e.g. `rllm serve --port 8000`)", fg=typer.colors.YELLOW)
    if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
        typer.secho(f"note: ${cfg.api_key_env} is not set in this shell; export it before running rllm",
                    fg=typer.colors.YELLOW)


@model_app.command("show")
def show_command(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show the configured default model (API keys masked)."""
    try:
        cfg = load_model_config()
    except ConfigError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if cfg is None:
        info: dict[str, Any] = {"configured": False, "kind": "embedded", "model": DEFAULT_EMBEDDED,
                                "note": "nothing configured: rllm uses the embedded model; run `rllm model setup`"}
    else:
        info = {"configured": True, **_describe(cfg)}
    info["config_file"] = str(config_path())
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        typer.echo(f"{key:>12}: {value}")
