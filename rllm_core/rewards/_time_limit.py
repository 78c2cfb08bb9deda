"""Run a pure-Python call with a wall-clock limit from any thread.

math-verify's own limit uses SIGALRM, which only works in the main thread; graders here run in worker
threads (the engine grades off the event loop). So the call runs in a daemon thread that is abandoned when
it overruns: the caller gets a `TimeoutError` on time, and the abandoned sympy call dies with the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["call_with_time_limit"]

R = TypeVar("R")


def call_with_time_limit(fn: Callable[..., R], seconds: float, *args: Any, **kwargs: Any) -> R:
    """`fn(*args, **kwargs)`, or TimeoutError after `seconds`; exceptions from `fn` are re-raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    worker = threading.Thread(target=run, name="rllm-grader", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', 'call')} did not finish within {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
