"""`install()` and `run_config()`: the OpenAI Agents SDK switched to captured, offline-safe, named calls.

- The SDK defaults to the Responses API, which capture records like chat (token ids and logprobs from vLLM's
  Responses fields, see `rllm_rollout.capture.responses`), so that default is kept. Opt in to chat completions
  with `install(chat_completions=True)` (process-wide) or `run_config(config, use_responses=False)`.
- Its default trace processor exports every span to api.openai.com from a background thread; offline that
  means retries and warnings, and in training it means uploading prompts. `install()` replaces it with
  `RLLMTracingProcessor`, which exports nothing (pass `export_traces=True` to keep OpenAI's exporter too).
- Agent names come from the SDK's own agent spans (see `tracing.py`), so tracing is switched on for the
  SDK; with our processor alone that sends nothing anywhere.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import openai
from agents import set_default_openai_api
from agents.models.openai_provider import OpenAIProvider
from agents.run_config import RunConfig
from agents.tracing import set_trace_processors, set_tracing_disabled
from agents.tracing.processors import default_processor
from openai import AsyncOpenAI

from rllm_adapters.openai_agents.tracing import RLLMTracingProcessor

__all__ = ["install", "installed_processor", "run_config"]

_lock = threading.Lock()
_processor: RLLMTracingProcessor | None = None


def install(*, export_traces: bool = False, chat_completions: bool = False) -> RLLMTracingProcessor:
    """Switch the Agents SDK to rllm's trace processor (and, if asked, to chat completions); idempotent.

    The SDK's processors become exactly `[RLLMTracingProcessor]`, or with `export_traces=True`
    `[RLLMTracingProcessor, the SDK's default exporting processor]`; the last call decides. The API the SDK's
    models use is left as it is (its default, the Responses API, is captured) unless `chat_completions=True`
    (`set_default_openai_api("chat_completions")`). Returns the process-wide processor (its
    `adhoc_episodes` hold runs made outside @rllm.rollout).
    """
    global _processor
    with _lock:
        if chat_completions:
            set_default_openai_api("chat_completions")
        if _processor is None:
            _processor = RLLMTracingProcessor()
        # set, never add: installing twice must not register the processor twice (each agent span
        # would then be entered twice and the agent name never undone).
        set_trace_processors([_processor, default_processor()] if export_traces else [_processor])
        set_tracing_disabled(False)
        return _processor


def _ensure_installed() -> None:
    """`install()` once; later calls keep whatever the user chose (e.g. `install(export_traces=True)`)."""
    if _processor is None:
        install()


def _unpooled_http_client() -> Any:
    """The SDK's default HTTP client class, keeping no idle connections.

    Nobody closes a RunConfig's client (the SDK gives no end-of-run hook), so a pooled keep-alive connection
    per episode would stay open until the garbage collector finds it: thousands of sockets in a long run.
    Without keep-alive each call opens its own loopback connection (a fraction of a millisecond) and closes it.
    """
    base = openai.DefaultAsyncHttpxClient
    lib = next((sys.modules.get(c.__module__.split(".")[0]) for c in base.__mro__
                if c.__module__.split(".")[0] in ("httpx", "httpx2")), None)
    if lib is None:
        return None  # an openai version with another transport: its own default client
    return base(limits=lib.Limits(max_connections=100, max_keepalive_connections=0))


def installed_processor() -> RLLMTracingProcessor | None:
    """The processor `install()` set up, or None before the first `install()` / `run_config()`."""
    return _processor


def run_config(config: Any = None, *, base_url: str | None = None, model: str | None = None,
               api_key: str | None = None, use_responses: bool | None = None, **kwargs: Any) -> RunConfig:
    """A `RunConfig` that sends this run's model calls to the episode's endpoint.

    Pass the rollout's `RolloutConfig` (`run_config(config)`), or `base_url=` / `model=` / `api_key=`.
    `use_responses` picks the API: None follows the SDK's default (the Responses API unless
    `install(chat_completions=True)` or `set_default_openai_api` said otherwise), False chat completions;
    both are captured.
    One RunConfig per episode keeps concurrent episodes on their own session URLs, which a global
    `set_default_openai_client` cannot, and gives each its own HTTP client: the SDK's default provider
    shares one process-wide client, bound to the first event loop, so the next `asyncio.run` (a new
    episode, another thread) fails with "Event loop is closed". Extra keyword arguments go to `RunConfig`.
    """
    _ensure_installed()
    base_url = base_url or getattr(config, "base_url", None)
    if base_url is None:
        raise ValueError("run_config needs the rollout's config (run_config(config)) or base_url=")
    model = model or getattr(config, "model", None)
    api_key = api_key or getattr(config, "api_key", None) or "EMPTY"
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=_unpooled_http_client())
    provider = OpenAIProvider(openai_client=client, use_responses=use_responses)
    return RunConfig(model=model, model_provider=provider, **kwargs)
