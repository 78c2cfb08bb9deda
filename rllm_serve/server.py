"""Starting and stopping the local policy server: engine thread + aiohttp loop thread, one handle.

`start_policy_server` returns once the port is bound, so the handle works the same from sync code, async code,
tests and the trainer. `update_weights` is the in-process weight sync (no restart, no disk).

One policy per role: serve a peft `PeftModel` holding one LoRA adapter per role and each request's `model`
(the adapter's name) picks the adapter; rows of different adapters decode in the same batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rllm_core.errors import ConfigError
from rllm_core.threaded_app import ThreadedApp
from rllm_serve.app import check_default_adapter, engine_adapters, make_app
from rllm_serve.engine import DecodeEngine, SwapMode
from rllm_serve.models import LoadedModel, load_model
from rllm_serve.weights_route import add_weights_route

__all__ = ["RunningPolicyServer", "start_policy_server"]


class RunningPolicyServer:
    """A policy server running in this process; a context manager that stops it on exit."""

    def __init__(self, engine: DecodeEngine, model_name: str, host: str, port: int,
                 default_adapter: str | None = None, admin_token: str | None = None) -> None:
        if model_name in engine_adapters(engine):
            raise ConfigError(f"an adapter is named {model_name!r}, the name the base model is served as, so the "
                              "base could not be asked for; rename the adapter or serve the model under another name")
        check_default_adapter(engine_adapters(engine), default_adapter)
        self.engine = engine
        self.model_name = model_name
        self.default_adapter = default_adapter
        self.host = host
        self._http = ThreadedApp(lambda: self._app(admin_token), host, port, name="rllm-policy-http",
                                 handler_cancellation=True)

    def _app(self, admin_token: str | None) -> Any:
        app = make_app(self.engine, self.model_name, self.default_adapter)
        if admin_token:  # a trainer on another host may push weights (weights_route.py)
            add_weights_route(app, self.engine, admin_token)
        return app

    @property
    def url(self) -> str:
        """``http://<host>:<port>``, set once listening."""
        return self._http.url

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

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapter names requests can pick with `model` ([] when a plain model is served)."""
        return list(engine_adapters(self.engine))

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], timeout: float | None = None,
                       version: int | None = None) -> int:
        """Serve `state_dict` from the next decode step on and return the new policy version.

        Nothing drains: what happens to requests in flight is the server's `swap_mode` ("finish": they end on
        the old weights, "resume": they re-prefill and go on under the new ones), and every token's version is
        reported. Where the server dropped a layer's dense weight (`own_model`) only its packed copy changes.
        Keys must be parameter names of the served
        model; a subset is fine (e.g. only the trained ones). For a peft model these are the PeftModel's own
        `state_dict()` names, so one adapter's LoRA tensors alone (`...lora_A.<adapter>.weight`,
        `...lora_B.<adapter>.weight`) update that adapter and leave the others and the base as they were. The
        version is the server's, shared by all adapters: any update bumps it.
        """
        return self.engine.update_weights(state_dict, timeout=timeout, version=version)

    def upstream_config(self) -> Any:
        """This server as a gateway upstream: token-id injection and token-exact multi-turn prompts on."""
        from rllm_rollout.gateway import UpstreamConfig

        return UpstreamConfig(url=self.base_url, inject_token_ids=True, exact_turns=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30) -> RunningPolicyServer:
        self.engine.start()
        try:
            self._http.start(timeout)
        except BaseException as exc:
            self.engine.stop()
            raise ConfigError(f"the policy server could not listen on {self.host}: {exc}; "
                              "choose another --port (0 picks a free one)") from None
        return self

    def stop(self) -> None:
        """End the running requests (they get an error), stop accepting new ones, stop both threads. Idempotent."""
        self.engine.stop()
        self._http.stop(timeout=15)

    def __enter__(self) -> RunningPolicyServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        adapters = f", adapters={self.adapters!r}" if self.adapters else ""
        return (f"RunningPolicyServer(model={self.model_name!r}{adapters}, url={self.url!r}, "
                f"version={self.policy_version})")


def start_policy_server(model: str | LoadedModel = "smollm2-135m", host: str = "127.0.0.1", port: int = 0,
                        max_batch_size: int = 32, threads: int | None = None,
                        default_adapter: str | None = None, kv_cache_gb: float | None = None,
                        swap_mode: SwapMode = "finish", own_model: bool | None = None,
                        admin_token: str | None = None) -> RunningPolicyServer:
    """Load `model` (a name/path, or an already loaded one) and serve it OpenAI-compatibly on host:port.

    port 0 picks a free port (see `.url`). Decoding runs on its own thread with up to `max_batch_size`
    sequences in one batch; `threads` sets torch's intra-op threads (default: torch's choice).

    A LoadedModel whose `.model` is a peft PeftModel with LoRA adapters (unmerged) serves each adapter under
    its name: a request whose `model` is an adapter's name samples with it, any other name with
    `default_adapter` (None: the base weights, no adapter). GET /v1/models lists the model and every adapter.

    `kv_cache_gb` sizes the KV block pool (default 1 GB, capped at what `max_batch_size` rows at full context
    use); `swap_mode` says what `update_weights` does to requests in flight: "finish" (on the old weights, kept in
    a copy until they end) or "resume" (on the new weights, their text so far prefilled again).

    `own_model`: nothing but the server uses the model object, so it keeps its linear layers' weights only in
    the layout it computes with (packed for oneDNN on a CPU), not twice. Default: True when the server loaded the
    model itself (a name or path), False for a LoadedModel, whose `.model` keeps its dense weights and stays
    usable: its packed linear layers answer its own forward calls too, and an in-place change of their weights
    (`load_state_dict`, an optimizer step) is repacked before the next use.

    `admin_token`: serve `PUT /admin/weights` behind it, for a trainer on another host (weights_route.py).
    """
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    engine = DecodeEngine(loaded, max_batch_size=max_batch_size, threads=threads, kv_cache_gb=kv_cache_gb,
                          swap_mode=swap_mode,
                          own_model=not isinstance(model, LoadedModel) if own_model is None else own_model)
    return RunningPolicyServer(engine, loaded.name, host, port, default_adapter, admin_token).start()
