"""Starting and stopping the local policy server: engine thread + aiohttp loop thread, one handle.

`start_policy_server` returns once the port is bound, so the handle works the same from sync code, async code,
tests and the trainer. `update_weights` is the in-process weight sync (no restart, no disk).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import torch
from aiohttp import web

from rllm_backends.local_torch.serving.app import make_app
from rllm_backends.local_torch.serving.engine import DecodeEngine
from rllm_backends.local_torch.serving.models import LoadedModel, load_model
from rllm_core.errors import ConfigError
from rllm_core.net import client_host

__all__ = ["RunningPolicyServer", "start_policy_server"]


class RunningPolicyServer:
    """A policy server running in this process; a context manager that stops it on exit."""

    def __init__(self, engine: DecodeEngine, model_name: str, host: str, port: int) -> None:
        self.engine = engine
        self.model_name = model_name
        self.host = host
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._serve, args=(port,), name="rllm-policy-http", daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL: ``{url}/v1``."""
        return self.url + "/v1"

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    @property
    def loaded(self) -> LoadedModel:
        return self.engine.loaded

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], timeout: float | None = None,
                       version: int | None = None) -> int:
        """Copy `state_dict` into the served model between decode steps and return the new policy version.

        Admissions pause while running sequences finish on the old weights, so every completion comes from a
        single policy version (the one its response reports). Keys must be parameter names of the served
        model; a subset is fine (e.g. only the trained ones).
        """
        return self.engine.update_weights(state_dict, timeout=timeout, version=version)

    def upstream_config(self) -> Any:
        """This server as a gateway upstream: token-id injection and token-exact multi-turn prompts on."""
        from rllm_core.gateway import UpstreamConfig

        return UpstreamConfig(url=self.base_url, inject_token_ids=True, exact_turns=True)

    # ------------------------------------------------------------------ lifecycle
    def _serve(self, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start(port))
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _start(self, port: int) -> None:
        self._runner = web.AppRunner(make_app(self.engine, self.model_name), access_log=None,
                                     handler_cancellation=True, shutdown_timeout=5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{client_host(self.host)}:{bound}"

    def start(self, timeout: float = 30) -> RunningPolicyServer:
        self.engine.start()
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            self.engine.stop()
            raise ConfigError(f"the policy server could not listen on {self.host}: {self._error}; "
                              "choose another --port (0 picks a free one)")
        return self

    def stop(self) -> None:
        """End the running requests (they get an error), stop accepting new ones, stop both threads. Idempotent."""
        self.engine.stop()
        if self._runner is not None and self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
            self._runner = None
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()

    def __enter__(self) -> RunningPolicyServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RunningPolicyServer(model={self.model_name!r}, url={self.url!r}, version={self.policy_version})"


def start_policy_server(model: str | LoadedModel = "smollm2-135m", host: str = "127.0.0.1", port: int = 0,
                        max_batch_size: int = 32, threads: int | None = None) -> RunningPolicyServer:
    """Load `model` (a name/path, or an already loaded one) and serve it OpenAI-compatibly on host:port.

    port 0 picks a free port (see `.url`). Decoding runs on its own thread with up to `max_batch_size`
    sequences in one batch; `threads` sets torch's intra-op threads (default: torch's choice).
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    engine = DecodeEngine(loaded, max_batch_size=max_batch_size, threads=threads)
    return RunningPolicyServer(engine, loaded.name, host, port).start()
