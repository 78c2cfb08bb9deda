"""The Tinker backend's own settings (`backend_options`, flat or under a `tinker:` key), typed: its sub-config."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["TinkerOptions"]


class TinkerOptions(BaseModel):
    """`backend_options` of `--backend tinker` (see rllm_backends.tinker.losses for `loss_fn`)."""

    model_config = ConfigDict(extra="forbid")

    loss_fn: str | None = None
    """One of Tinker's built-in losses by name (importance_sampling, ppo, cispo), with Tinker's semantics,
    instead of rllm's own --loss computed through forward_backward_custom."""
    loss_fn_config: dict[str, float] | None = None
    """The built-in loss's thresholds (default: from --clip-low / --clip-high)."""
    max_concurrency: int = Field(64, ge=1)
    """Sampling requests in flight on the service at once."""

    @model_validator(mode="before")
    @classmethod
    def _unwrap(cls, data: Any) -> Any:
        """`backend_options: {tinker: {...}}` (a section per backend in one file) reads as the flat form."""
        if isinstance(data, dict) and set(data) == {"tinker"} and isinstance(data["tinker"], dict):
            return data["tinker"]
        return data
