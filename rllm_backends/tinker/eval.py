"""`rllm eval --backend tinker --model M`: sample from a Tinker base model, or from a run's trained weights.

`M` is either a base model the service offers, or a run directory of `rllm train --backend tinker` (its latest
complete checkpoint names the sampler weights `TinkerBackend.save` wrote). Either way the samples are served by
the same local OpenAI-compatible adapter the training rollouts use, so eval episodes are recorded exactly alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rllm_core.errors import ConfigError

__all__ = ["sampling_client_for", "tinker_eval_endpoint"]


def sampling_client_for(service: Any, model: str) -> tuple[Any, str, int | None]:
    """(sampling client, base model name, context length) for a base model name or a tinker run directory."""
    from rllm_backends.tinker.backend import check_base_model, read_checkpoint
    from rllm_backends.tinker.retry import call_with_retries
    from rllm_core.runs.checkpoints import latest_checkpoint

    path = Path(model)
    if path.is_dir():
        ckpt = latest_checkpoint(path / "checkpoints")
        if ckpt is None:
            raise ConfigError(f"--model {model}: a directory, but it holds no complete checkpoint under "
                              "checkpoints/; give a run directory of `rllm train --backend tinker`, or a base model")
        state = read_checkpoint(ckpt)
        base = str(state["base_model"])
        context = check_base_model(service, base, need="sampleable")
        client = call_with_retries(lambda: service.create_sampling_client(model_path=state["sampler_path"]).result(),
                                   what="create_sampling_client")
        return client, base, context
    context = check_base_model(service, model, need="sampleable")
    client = call_with_retries(lambda: service.create_sampling_client(base_model=model).result(),
                               what="create_sampling_client")
    return client, model, context


@contextmanager
def tinker_eval_endpoint(model: str) -> Iterator[Any]:
    from rllm_backends.tinker.sdk import require_api_key, service_client
    from rllm_backends.tinker.server import start_tinker_sampling_server
    from rllm_envs.eval.endpoint import Endpoint

    require_api_key()
    service = service_client()
    try:
        client, base, context = sampling_client_for(service, model)
        with start_tinker_sampling_server(client, model_name=base, tokenizer=client.get_tokenizer(),
                                          context_length=context) as server:
            yield Endpoint(server.base_url, server.model_name, None, "backend")
    finally:
        if hasattr(service, "close"):  # ends the session on the service (SDK 0.38)
            with contextlib.suppress(Exception):
                service.close("success").result(30)
