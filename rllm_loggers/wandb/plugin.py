"""Registers the `wandb` logger; the wandb package is imported only when a run opens it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.loggers import LoggerSpec

__all__ = ["rllm_register_loggers"]


def _factory(run_dir: Path) -> Any:
    from rllm_loggers.wandb.logger import WandbLogger

    return WandbLogger(run_dir)


@hookimpl
def rllm_register_loggers() -> list[LoggerSpec]:
    return [LoggerSpec(name="wandb", factory=_factory, requires="rllm[wandb]",
                       description="Weights & Biases run in <run>/wandb/ (offline unless WANDB_MODE=online "
                                   "and WANDB_API_KEY are set; `wandb sync` uploads it later)")]
