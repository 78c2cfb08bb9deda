"""Which model endpoint an eval talks to, checked before any episode starts.

Order: `--base-url` · the model saved by `rllm model setup` · the embedded model, served by the local
policy server for the duration of the run (`--model tiny-random` picks another built-in).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Literal

from rllm_core.errors import ConfigError
from rllm_core.net import check_reachable  # re-exported: `rllm_envs.eval.check_reachable` is public
from rllm_core.plugins import PluginManager, get_plugin_manager
from rllm_envs.eval.model_config import DEFAULT_EMBEDDED, load_model_config

__all__ = ["Endpoint", "EvalEndpointSpec", "check_reachable", "get_eval_endpoints", "open_endpoint"]

log = logging.getLogger("rllm.eval")


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    api_key: str | None
    source: Literal["flag", "config", "embedded", "backend"]


@dataclass(frozen=True)
class EvalEndpointSpec:
    """A backend that serves models for `rllm eval --backend NAME --model M`: `serve(M)` is a context manager
    yielding the Endpoint for M (a base model name, or a run directory that backend trained)."""

    name: str
    serve: Callable[[str], AbstractContextManager[Endpoint]]
    description: str = ""


def get_eval_endpoints(pm: PluginManager | None = None) -> dict[str, EvalEndpointSpec]:
    """Eval endpoints by backend name (`rllm_register_eval_endpoints`); the first in call order wins a clash."""
    return (pm or get_plugin_manager()).collect_named("rllm_register_eval_endpoints")


@contextmanager
def open_endpoint(base_url: str | None, model: str | None, api_key: str | None = None,
                  check: bool = True, backend: str | None = None) -> Iterator[Endpoint]:
    """Yield a reachable endpoint; an embedded server started here is stopped on exit."""
    if backend:
        if base_url:
            raise ConfigError(f"--backend {backend} serves the model itself: drop --base-url")
        with _from_backend(backend, model) as ep:
            yield ep
        return
    if base_url:
        ep = Endpoint(base_url, model or "", api_key, "flag")
    else:
        cfg = load_model_config()
        if cfg is not None and cfg.kind != "embedded":
            assert cfg.base_url is not None  # checked when the config was loaded
            ep = Endpoint(cfg.base_url, model or cfg.model, api_key or cfg.resolve_api_key(), "config")
        else:
            name = model or (cfg.model if cfg else DEFAULT_EMBEDDED)
            with _embedded(name) as ep:
                yield ep
            return
    served = check_reachable(ep.base_url, ep.api_key) if check else []
    if not ep.model or (ep.model == "default" and served and "default" not in served):
        # --base-url without --model, or a setup that saved no name: the server's only (or first) model
        ep = Endpoint(ep.base_url, served[0] if served else "default", ep.api_key, ep.source)
    elif served and ep.model not in served:  # a warning: some servers accept aliases they do not list
        log.warning("model %r is not among the models %s lists (%s); pass --model with one of them if "
                    "every episode fails", ep.model, ep.base_url, ", ".join(served[:10]))
    yield ep


@contextmanager
def _from_backend(name: str, model: str | None) -> Iterator[Endpoint]:
    specs = get_eval_endpoints()
    if name not in specs:
        raise ConfigError(f"the {name!r} backend does not serve models for eval (backends that do: "
                          f"{', '.join(sorted(specs)) or 'none'}); evaluate its run with --base-url or --model "
                          "instead")
    serve = specs[name].serve
    if not model:
        raise ConfigError(f"--backend {name} needs --model: a base model name or a run directory it trained")
    with serve(model) as ep:
        yield ep


@contextmanager
def _embedded(name: str) -> Iterator[Endpoint]:
    try:
        from rllm_serve import start_policy_server
    except ImportError as exc:
        raise ConfigError(
            f"no --base-url and no configured model, and the embedded model cannot start ({exc}). "
            "Install the local server with `pip install 'rllm[serve]'`, or pass --base-url."
        ) from exc
    server = start_policy_server(name)
    try:
        yield Endpoint(server.base_url, server.model_name, None, "embedded")
    finally:
        server.stop()
