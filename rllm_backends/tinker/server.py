"""An OpenAI-compatible server answering with a Tinker `SamplingClient`: a gateway upstream like vLLM.

The HTTP app and its thread are the local policy server's (`RunningPolicyServer` over `make_app`); only the
engine differs (`TinkerSamplingEngine`). So `upstream_config()` gives the gateway the same token-id injection
and token-exact multi-turn prompts, and a weight sync is `swap(new_sampling_client, version)` instead of
copying a state dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from rllm_backends.tinker.sampling import TinkerLoaded, TinkerSamplingEngine
from rllm_serve.server import RunningPolicyServer

__all__ = ["TinkerSamplingServer", "start_tinker_sampling_server"]


class TinkerSamplingServer(RunningPolicyServer):
    """A running server whose engine is a `TinkerSamplingEngine`; a context manager that stops it on exit."""

    def __init__(self, engine: TinkerSamplingEngine, model_name: str, host: str, port: int) -> None:
        super().__init__(cast(Any, engine), model_name, host, port)  # duck-typed: the app needs no more
        self.tinker_engine = engine

    @property
    def loaded(self) -> TinkerLoaded:  # type: ignore[override]
        return self.tinker_engine.loaded

    @property
    def sampling_client(self) -> Any:
        """The client new requests are sent to."""
        return self.tinker_engine.sampling_client

    def swap(self, sampling_client: Any, policy_version: int | None = None) -> int:
        """Serve `sampling_client` (new weights) from now on as `policy_version` (default: current + 1).

        Requests already running finish on the client they started with and report the version they started
        with; returns the new version.
        """
        return self.tinker_engine.swap(sampling_client, policy_version)

    def update_weights(self, state_dict: Mapping[str, Any], timeout: float | None = None,
                       version: int | None = None) -> int:
        raise TypeError("a Tinker sampling server has no local weights: save the trained weights for a sampler "
                        "on the service and call swap(new_sampling_client, version)")

    def __repr__(self) -> str:
        return f"TinkerSamplingServer(model={self.model_name!r}, url={self.url!r}, version={self.policy_version})"


def start_tinker_sampling_server(sampling_client: Any, *, model_name: str, tokenizer: Any = None,
                                 context_length: int | None = None, host: str = "127.0.0.1", port: int = 0,
                                 max_concurrency: int = 64, eos_token_ids: Iterable[int] | None = None,
                                 policy_version: int = 0, retry_attempts: int = 5, retry_wait_s: float = 0.5,
                                 retry_max_wait_s: float = 16.0) -> TinkerSamplingServer:
    """Serve `sampling_client` OpenAI-compatibly as `model_name` on host:port (0 = a free port); returns once
    listening.

    `tokenizer` defaults to `sampling_client.get_tokenizer()`; `context_length` (default 32768) should be the
    service's max context length for the model; `eos_token_ids` default to the tokenizer's. At most
    `max_concurrency` sample calls run at once; transient SDK errors are retried `retry_attempts` times in all
    with exponential backoff from `retry_wait_s` up to `retry_max_wait_s` seconds.
    """
    engine = TinkerSamplingEngine(sampling_client, model_name=model_name, tokenizer=tokenizer,
                                  context_length=context_length, eos_token_ids=eos_token_ids,
                                  policy_version=policy_version, max_concurrency=max_concurrency,
                                  retry_attempts=retry_attempts, retry_wait_s=retry_wait_s,
                                  retry_max_wait_s=retry_max_wait_s)
    server = TinkerSamplingServer(engine, model_name, host, port)
    server.start()
    return server
