"""Registers the `tensorboard` logger; the tensorboard package is imported only when a run opens it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rllm_core.hookspecs import hookimpl
from rllm_core.loggers import LoggerSpec

__all__ = ["rllm_register_loggers"]


def _factory(run_dir: Path) -> Any:
    from rllm_loggers.tensorboard.logger import TensorBoardLogger

    return TensorBoardLogger(run_dir)


@hookimpl
def rllm_register_loggers() -> list[LoggerSpec]:
    return [LoggerSpec(name="tensorboard", factory=_factory, requires="rllm[tensorboard]",
                       description="scalars in <run>/tensorboard/ (tensorboard --logdir <run>)")]
