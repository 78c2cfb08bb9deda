"""The local backend's own settings (`backend_options` in a train YAML/TOML), typed: its sub-config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

__all__ = ["DEFAULT_MICRO_BATCH_TOKENS", "LocalOptions", "thread_budgets"]

DEFAULT_MICRO_BATCH_TOKENS = 2048
"""As fast on CPU as one pack of a whole 8 × 4 × 64-token GRPO batch (~2.8k tokens), at ~3/4 of its activation
memory (measured on smollm2-135m: 1024 tokens no slower; 512 ~10 % slower)."""


class LocalOptions(BaseModel):
    """`backend_options` of `--backend local`."""

    model_config = ConfigDict(extra="forbid")

    micro_batch_tokens: int | None = None
    """Tokens per packed micro-batch (default: --micro-batch-size × --max-seq-len, at most 2048): lower it when
    a step runs out of memory, raise it to pack more rows per forward pass."""

    server_dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    """The policy server's weights dtype (the trainer keeps fp32 master weights): auto is bf16 where the CPU has
    AVX512-BF16 / AMX (or the GPU supports it), as `rllm serve` picks. A bf16 sampler is faster and differs from
    the trainer's numbers: `train/mismatch_kl` measures it, `--recompute-old-logprobs --rollout-is token`
    corrects it."""
    server_threads: int | None = None
    """torch threads of the policy server's engine (default: torch's; with --max-staleness, half the cores)."""
    trainer_threads: int | None = None
    """torch threads of the update (default: torch's; with --max-staleness, the cores the server does not get)."""
    policy_server: str | None = None
    """An `rllm serve --admin-token` on another host (its URL): rollouts sample there and every step's weights are
    pushed to it (PUT /admin/weights, token from $RLLM_SERVE_ADMIN_TOKEN). None: a server in this process."""

    train_vision: bool = False
    """A vision-language model's vision tower and connector train too (default: frozen, their features computed
    without autograd; with --lora-rank the adapters go on the text decoder only either way)."""

    @field_validator("micro_batch_tokens", "server_threads", "trainer_threads", mode="before")
    @classmethod
    def _whole_tokens(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"must be a whole number ≥ 1, got {value!r}; e.g. {DEFAULT_MICRO_BATCH_TOKENS} tokens "
                             "or 1 thread")
        return value


def thread_budgets(options: LocalOptions, asynchronous: bool, cores: int) -> tuple[int | None, int | None]:
    """(server threads, trainer threads). Synchronously the two never run at once, so each takes every core
    (None: torch's default) unless set. Asynchronously they run side by side: two OpenMP teams of `cores` threads
    each would oversubscribe the cores and spin against each other, so the cores are split, the server getting
    half (rounded down, at least 1) and the trainer the rest."""
    if not asynchronous:
        return options.server_threads, options.trainer_threads
    server = options.server_threads or max(1, cores // 2)
    return server, options.trainer_threads or max(1, cores - server)
