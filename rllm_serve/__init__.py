"""The local policy server: any causal LM served OpenAI-compatibly with vLLM's token-id fields, from one process.

    from rllm_serve import start_policy_server
    with start_policy_server("tiny-random") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="-")
        ...
        server.update_weights(trained_model.state_dict())   # -> new policy_version

See docs/serving.md for the endpoints, the logprob rule and how weight updates interact with running requests.
Names are imported lazily so that `rllm --help` (which loads the `serve` plugin) does not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import rllm_core.cpu_runtime  # noqa: F401  (before torch loads: bounded OpenMP spinning and oneDNN cache)

if TYPE_CHECKING:
    from rllm_serve.models import LoadedModel, load_model
    from rllm_serve.server import RunningPolicyServer, start_policy_server

__all__ = ["LoadedModel", "RunningPolicyServer", "load_model", "start_policy_server"]

_WHERE = {"LoadedModel": "models", "load_model": "models", "RunningPolicyServer": "server",
          "start_policy_server": "server"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
