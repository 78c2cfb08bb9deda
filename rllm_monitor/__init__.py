"""The training monitor: `rllm view` serves a page of a run's curves, episodes and zero-reward diagnosis.

    from rllm_monitor import start_view_server
    with start_view_server("runs/latest") as server:    # a run directory, or a folder of runs
        print(server.page_url)

It reads run directories through rllm_core.runs (the format `rllm train` and `rllm eval` write) and never
needs torch: a run's tokenizer, for token texts, is loaded only when the run's model has one locally.
Names are imported lazily so that `rllm --help` (which loads this plugin) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rllm_monitor.server import ViewServer, make_app, start_view_server

__all__ = ["ViewServer", "make_app", "start_view_server"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.server"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
