"""Leave nothing behind: the sandboxes of this process are closed at interpreter exit and on SIGTERM, and the
directories of a process that died without closing (SIGKILL, OOM) are swept by the next provider that starts one.

Processes cannot leak even then: each command's bwrap has `--die-with-parent` and its own pid namespace, so the
kernel kills the whole tree when the rllm process dies. Only host directories need this module.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

__all__ = ["chown_tree", "close_all", "live_sandboxes", "make_sandbox_dir", "register", "remove_tree",
           "sweep_stale", "unregister"]

_OWNER = ".owner"
_STALE_AFTER_S = 60.0


class _Closable(Protocol):
    def close(self) -> None: ...


_live: set[Any] = set()
_lock = threading.Lock()
_hooks_installed = False


def live_sandboxes() -> list[Any]:
    """The sandboxes of this process not closed yet."""
    with _lock:
        return list(_live)


def register(sandbox: _Closable) -> None:
    global _hooks_installed
    with _lock:
        _live.add(sandbox)
        if _hooks_installed:
            return
        _hooks_installed = True
    atexit.register(close_all)
    _install_sigterm()


def unregister(sandbox: _Closable) -> None:
    with _lock:
        _live.discard(sandbox)


def close_all() -> None:
    """Close every live sandbox of this process (atexit, SIGTERM)."""
    for sandbox in live_sandboxes():
        with contextlib.suppress(Exception):
            sandbox.close()


def _install_sigterm() -> None:
    """Chain a SIGTERM handler that closes the sandboxes, then lets SIGTERM do what it did before. Only from the
    main thread and only over the default or an existing Python handler (never over a C-level/ignored one)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        close_all()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, handler)


def make_sandbox_dir(root: Path, name: str) -> tuple[Path, int]:
    """A fresh `<root>/<name>-XXXX/` (0700) with its `.owner` lock held by this process (fd returned)."""
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        os.chmod(root, 0o711)  # sandbox uids must traverse root to reach their own dir; they cannot list it
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "task"
    host_dir = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=root))
    fd = os.open(host_dir / _OWNER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return host_dir, fd


def sweep_stale(root: Path) -> None:
    """Remove sandbox dirs under `root` whose owner lock is free (their process died) and that are not brand new."""
    if not root.is_dir():
        return
    now = time.time()
    for entry in os.scandir(root):
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        owner = Path(entry.path) / _OWNER
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < _STALE_AFTER_S:
                continue
            fd = os.open(owner, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        remove_tree(Path(entry.path))
        os.close(fd)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give a sandbox dir (all but its `.owner` lock) to the sandbox's uid; symlinks themselves, never targets."""
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            if dirpath == str(path) and name == _OWNER:
                continue
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def remove_tree(path: Path) -> None:
    """rmtree that also removes what a sandbox made read-only (as a normal user) and never follows symlinks."""

    def fix(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            parent = os.path.dirname(target)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            func(target)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=fix)
