"""Block a CLI's main thread until Ctrl-C or SIGTERM, for commands that serve from background threads.

`rllm serve`, `rllm gateway` and `rllm view` print a URL and then only wait. Waiting in one long call
(`time.sleep(3600)`, `Event().wait()`) looked enough but was not: the kernel hands a process-directed signal to
any thread that does not block it, and when the server's event-loop thread took SIGINT, Python's handler only
flagged it for the main thread, which stayed asleep, so the command ignored Ctrl-C (seen as a test that waited
60 s for `rllm view` to exit under load). Waking every half second lets the main thread notice the flag.
Handlers are installed explicitly because a shell's background job starts with SIGINT ignored.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["wait_for_stop_signal"]


def wait_for_stop_signal(poll_s: float = 0.5) -> int:
    """Return the number of the first SIGINT or SIGTERM received; the previous handlers are restored."""
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(poll_s):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received[0]
