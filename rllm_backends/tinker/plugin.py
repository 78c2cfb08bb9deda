"""Registers the `tinker` training backend (update and sampling on the Tinker service; rollouts here)."""

from __future__ import annotations

from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import BackendSpec

__all__ = ["rllm_register_backends"]


def _factory(config: Any) -> Any:
    from rllm_backends.tinker.backend import TinkerBackend

    return TinkerBackend(config)


def _eval_endpoint(model: str) -> Any:
    from rllm_backends.tinker.eval import tinker_eval_endpoint

    return tinker_eval_endpoint(model)


@hookimpl
def rllm_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="tinker", factory=_factory, requires="rllm[tinker]", eval_endpoint=_eval_endpoint,
                        description="LoRA training and sampling on the Tinker service (needs TINKER_API_KEY)")]
