"""What other threads hand the engine thread besides generation requests: weight swaps and weight releases.

Each is applied between two decode steps on the engine thread (the only thread that touches the model and the KV
pool); the caller waits on `done` and reads the outcome the engine wrote.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

__all__ = ["WeightRelease", "WeightUpdate"]


class WeightUpdate:
    """Serve `state_dict` from the next step on; `version` is set (or `error`) when done."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.state_dict = state_dict
        self.done = threading.Event()
        self.target = version
        self.version: int | None = None
        self.error: BaseException | None = None


class WeightRelease:
    """Drop the packed weights while idle; `released` says whether the engine did."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.released = False
