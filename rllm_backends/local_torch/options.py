"""The local backend's own settings (`backend_options` in a train YAML/TOML), typed: its sub-config."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

__all__ = ["DEFAULT_MICRO_BATCH_TOKENS", "LocalOptions"]

DEFAULT_MICRO_BATCH_TOKENS = 2048
"""As fast on CPU as one pack of a whole 8 × 4 × 64-token GRPO batch (~2.8k tokens), at ~3/4 of its activation
memory (measured on smollm2-135m: 1024 tokens no slower; 512 ~10 % slower)."""


class LocalOptions(BaseModel):
    """`backend_options` of `--backend local`."""

    model_config = ConfigDict(extra="forbid")

    micro_batch_tokens: int | None = None
    """Tokens per packed micro-batch (default: --micro-batch-size × --max-seq-len, at most 2048): lower it when
    a step runs out of memory, raise it to pack more rows per forward pass."""

    @field_validator("micro_batch_tokens", mode="before")
    @classmethod
    def _whole_tokens(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a whole number of tokens ≥ 1, got {value!r}; e.g. {DEFAULT_MICRO_BATCH_TOKENS}")
        return value
