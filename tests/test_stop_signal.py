"""wait_for_stop_signal: the main thread wakes even when another thread took the signal."""

from __future__ import annotations

import signal
import threading
import time

from rllm_core.stop_signal import wait_for_stop_signal


def _signal_from_thread(sig: int, main: int, delay_s: float = 0.2) -> threading.Thread:
    """A thread that takes `sig` itself (as a server's event-loop thread may), and SIGTERMs the main thread if
    the wait has not returned 5 s later (so a regression fails instead of hanging)."""
    done = threading.Event()

    def run() -> None:
        time.sleep(delay_s)
        signal.pthread_kill(threading.get_ident(), sig)
        if not done.wait(5):
            signal.pthread_kill(main, signal.SIGTERM)

    thread = threading.Thread(target=run, daemon=True)
    thread.done = done  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_a_signal_taken_by_another_thread_still_ends_the_wait() -> None:
    before = signal.getsignal(signal.SIGINT)
    thread = _signal_from_thread(signal.SIGINT, threading.get_ident())
    start = time.monotonic()
    got = wait_for_stop_signal(poll_s=0.1)
    thread.done.set()  # type: ignore[attr-defined]
    assert got == signal.SIGINT and time.monotonic() - start < 3
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_sigterm_ends_the_wait_too() -> None:
    thread = _signal_from_thread(signal.SIGTERM, threading.get_ident(), delay_s=0.1)
    assert wait_for_stop_signal(poll_s=0.1) == signal.SIGTERM
    thread.done.set()  # type: ignore[attr-defined]
