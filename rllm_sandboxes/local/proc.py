"""Process plumbing for the local sandbox: output capture with a size cap, whole-tree kills, per-uid slots.

Kept apart from the provider so the policy (what bwrap gets) reads separately from the mechanics (pipes, signals,
locks).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import IO

__all__ = ["OutputCapture", "UidSlot", "acquire_uid_slot", "kill_group", "kill_uid", "processes_of_uid"]

_MARK = b"\n...[output truncated]...\n"


class OutputCapture:
    """Reads a pipe on a thread, keeping the first and last `limit // 2` bytes; huge outputs never fill memory."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self._fd = stream.fileno()
        self._stream = stream
        self._half = max(1, limit // 2)
        self._limit = limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self._thread = threading.Thread(target=self._run, name="rllm-sandbox-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                self.total += len(chunk)
                room = self._half - len(self._head)
                if room > 0:
                    self._head += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    self._tail += chunk
                    if len(self._tail) > 2 * self._half:
                        del self._tail[: len(self._tail) - self._half]
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self._stream.close()

    def result(self, join_timeout: float = 5.0) -> tuple[str, bool]:
        """(text, truncated) once the pipe is at EOF (every writer, i.e. every sandbox process, is gone)."""
        self._thread.join(join_timeout)
        truncated = self.total > self._limit
        data = bytes(self._head) + (_MARK + bytes(self._tail[-self._half:]) if truncated else bytes(self._tail))
        return data.decode("utf-8", "replace"), truncated


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; its bwrap dies and, with it, the sandbox's pid namespace (every process in it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def processes_of_uid(uid: int, *, zombies: bool = False) -> list[int]:
    """Pids whose real uid is `uid` (from /proc), for leftovers of a sandbox running as its own uid. Zombies (dead,
    waiting for a parent to reap them: holding no memory, running nothing) are left out unless asked for."""
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as fh:
                state = b""
                for line in fh:
                    if line.startswith(b"State:"):
                        state = line.split()[1]
                    elif line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid and (zombies or state not in (b"Z", b"X")):
                            pids.append(int(entry.name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return pids


def kill_uid(uid: int, *, wait_s: float = 5.0) -> bool:
    """SIGKILL every process of `uid` (only for a pool uid, which nothing but one sandbox uses) and wait until
    none is alive; False if some still were after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while pids := processes_of_uid(uid):
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return True


class UidSlot:
    """A host uid/gid owned by one sandbox while its lock file stays flocked (released when closed or at exit)."""

    def __init__(self, uid: int, fd: int | None) -> None:
        self.uid = uid
        self.gid = uid
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def acquire_uid_slot(lock_dir: Path, base: int, size: int) -> UidSlot:
    """The first free uid in [base, base + size), across processes (flock), starting at a random slot."""
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    start = random.randrange(size)
    for i in range(size):
        uid = base + (start + i) % size
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        kill_uid(uid)  # a previous owner that died without closing cannot leave anything running as us
        return UidSlot(uid, fd)
    raise OSError(f"all {size} sandbox uids from {base} are in use")
