"""Run a pure-Python call with a wall-clock limit from any thread.

math-verify's own limit uses SIGALRM, which only works in the main thread; graders here run in worker
threads (the engine grades off the event loop). So the call runs in a daemon thread that is abandoned when
it overruns: the caller gets a `TimeoutError` on time, and the abandoned sympy call dies with the process.
Abandoned calls still use CPU until they end, so once `MAX_STUCK` of them are running, new calls fail with
`TimeoutError` at once instead of piling up more (a pathological batch cannot starve the training loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["MAX_STUCK", "call_with_time_limit", "stuck_calls"]

R = TypeVar("R")
MAX_STUCK = 8
_stuck: set[threading.Thread] = set()
_lock = threading.Lock()


def stuck_calls() -> int:
    """How many calls that overran their limit are still running."""
    with _lock:
        _stuck.difference_update([t for t in _stuck if not t.is_alive()])
        return len(_stuck)


def call_with_time_limit(fn: Callable[..., R], seconds: float, *args: Any, **kwargs: Any) -> R:
    """`fn(*args, **kwargs)`, or TimeoutError after `seconds`; exceptions from `fn` are re-raised."""
    name = getattr(fn, "__name__", "call")
    if stuck_calls() >= MAX_STUCK:
        raise TimeoutError(f"{name} not started: {MAX_STUCK} earlier calls overran their limit and still run")
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
        with _lock:
            _stuck.add(worker)
        raise TimeoutError(f"{name} did not finish within {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
