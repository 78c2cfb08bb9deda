"""Registers the `tinker` training backend (update and sampling on the Tinker service; rollouts here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm_backends.tinker.options import TinkerOptions
from rllm_core.hookspecs import hookimpl
from rllm_envs.eval.endpoint import EvalEndpointSpec
from rllm_train.backend import BackendSpec

__all__ = ["rllm_register_backends", "rllm_register_eval_endpoints"]


def _factory(config: Any) -> Any:
    from rllm_backends.tinker.backend import TinkerBackend

    return TinkerBackend(config)


def _eval_endpoint(model: str) -> Any:
    from rllm_backends.tinker.eval import tinker_eval_endpoint

    return tinker_eval_endpoint(model)


def _owns(ckpt: Path) -> bool:
    from rllm_backends.tinker.export import is_tinker_checkpoint

    return is_tinker_checkpoint(ckpt)


def _export(ckpt: Path, request: Any) -> Any:
    from rllm_backends.tinker.export import export_tinker

    return export_tinker(ckpt, request)


@hookimpl
def rllm_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="tinker", factory=_factory, requires="rllm[tinker]", owns_checkpoint=_owns,
                        export=_export, options=TinkerOptions,
                        description="LoRA training and sampling on the Tinker service (needs TINKER_API_KEY)")]


@hookimpl
def rllm_register_eval_endpoints() -> list[EvalEndpointSpec]:
    return [EvalEndpointSpec(name="tinker", serve=_eval_endpoint,
                             description="a base model or a Tinker run, sampled on the Tinker service")]
