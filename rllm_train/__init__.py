"""Training: config, packing of trajectories into train rows, the loop behind `rllm train`, checkpoints and
the run directory. The algorithms themselves live in `rllm_train.algorithms`; backends implement
`rllm_train.backend.Backend`. Names resolve lazily: loading the `rllm train` plugin must not load torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "PhaseTimer",
    "RunDir",
    "TrainConfig",
    "TrainResult",
    "TrainRow",
    "atrain",
    "episode_metrics",
    "latest_checkpoint",
    "load_config",
    "pack_groups",
    "pack_trajectory",
    "read_state",
    "sample_tasks",
    "save_checkpoint",
    "train",
]

_HOME = {
    "latest_checkpoint": "checkpoints", "read_state": "checkpoints", "save_checkpoint": "checkpoints",
    "TrainConfig": "config", "load_config": "config",
    "TrainResult": "loop", "atrain": "loop", "sample_tasks": "loop", "train": "loop",
    "PhaseTimer": "metrics", "episode_metrics": "metrics",
    "TrainRow": "packing", "pack_groups": "packing", "pack_trajectory": "packing",
    "RunDir": "rundir",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'rllm_train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rllm_train.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
