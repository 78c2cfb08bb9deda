"""`install()` and `run_config()`: the OpenAI Agents SDK switched to captured, offline-safe, named calls.

- The SDK defaults to the Responses API, which capture does not record (no token ids on that wire):
  `install()` switches it to chat completions (`set_default_openai_api("chat_completions")`).
- Its default trace processor exports every span to api.openai.com from a background thread; offline that
  means retries and warnings, and in training it means uploading prompts. `install()` replaces it with
  `RLLMTracingProcessor`, which exports nothing (pass `export_traces=True` to keep OpenAI's exporter too).
- Agent names come from the SDK's own agent spans (see `tracing.py`), so tracing is switched on for the
  SDK; with our processor alone that sends nothing anywhere.
"""

from __future__ import annotations

import threading
from typing import Any

from agents import set_default_openai_api
from agents.models.openai_provider import OpenAIProvider
from agents.run_config import RunConfig
from agents.tracing import add_trace_processor, set_trace_processors, set_tracing_disabled
from openai import AsyncOpenAI

from rllm_adapters.openai_agents.tracing import RLLMTracingProcessor

__all__ = ["install", "installed_processor", "run_config"]

_lock = threading.Lock()
_processor: RLLMTracingProcessor | None = None


def install(*, export_traces: bool = False) -> RLLMTracingProcessor:
    """Switch the Agents SDK to chat completions and to rllm's trace processor; idempotent.

    Returns the process-wide processor (its `adhoc_episodes` hold runs made outside @rllm.rollout).
    """
    global _processor
    with _lock:
        set_default_openai_api("chat_completions")
        if _processor is None:
            _processor = RLLMTracingProcessor()
        if export_traces:
            add_trace_processor(_processor)
        else:
            set_trace_processors([_processor])
        set_tracing_disabled(False)
        return _processor


def installed_processor() -> RLLMTracingProcessor | None:
    return _processor


def run_config(config: Any = None, *, base_url: str | None = None, model: str | None = None,
               api_key: str | None = None, **kwargs: Any) -> RunConfig:
    """A `RunConfig` that sends this run's model calls to the episode's endpoint over chat completions.

    Pass the rollout's `RolloutConfig` (`run_config(config)`), or `base_url=` / `model=` / `api_key=`.
    One RunConfig per episode keeps concurrent episodes on their own session URLs, which a global
    `set_default_openai_client` cannot, and gives each its own HTTP client: the SDK's default provider
    shares one process-wide client, bound to the first event loop, so the next `asyncio.run` (a new
    episode, another thread) fails with "Event loop is closed". Extra keyword arguments go to `RunConfig`.
    """
    install()
    base_url = base_url or getattr(config, "base_url", None)
    if base_url is None:
        raise ValueError("run_config needs the rollout's config (run_config(config)) or base_url=")
    model = model or getattr(config, "model", None)
    api_key = api_key or getattr(config, "api_key", None) or "EMPTY"
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    provider = OpenAIProvider(openai_client=client, use_responses=False)
    return RunConfig(model=model, model_provider=provider, **kwargs)
