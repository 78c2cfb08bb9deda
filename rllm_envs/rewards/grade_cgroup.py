"""One control group per grade: memory and process limits that hold across every child a solution starts.

An rlimit is per process (RLIMIT_AS) or per user (RLIMIT_NPROC, which does not bind when rllm runs as root:
the namespace's root is the host's root), so a solution that forks — even through `_posixsubprocess.fork_exec`,
which the audit hook never sees — multiplies its memory and its process count. A cgroup counts them together:
`memory` caps the bytes of the whole tree (tmpfs pages written by it included), `pids` caps its processes; the
kernel's own counters say afterwards which limit was hit, and every process left is killed through it.

Both layouts are handled: cgroup v2 (a delegated subtree: the group is made beside us with `memory` and `pids`
enabled, or not at all) and v1 (the `memory` and `pids` hierarchies, writable as root in most containers).
`GradeCgroup.create` returns None where neither is writable; the sandbox then falls back to rlimits per process.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from pathlib import Path

__all__ = ["GradeCgroup"]

_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) → this process's cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


class GradeCgroup:
    """A cgroup (v2: one directory; v1: one in `memory` and one in `pids`) for one grade's process tree."""

    def __init__(self, dirs: dict[str, Path], v2: bool) -> None:
        self.dirs = dirs
        """"memory" / "pids" → the directory holding that controller's files (the same one under v2)."""
        self.v2 = v2

    # ------------------------------------------------------------------------------------------------ setup
    @classmethod
    def create(cls, memory_bytes: int, max_pids: int) -> GradeCgroup | None:
        """A fresh group with both limits set, or None where this process cannot make one."""
        name = f"rllm-grade-{secrets.token_hex(6)}"
        own = _own_paths()
        try:
            if (_ROOT / "cgroup.controllers").is_file():
                group = cls._make_v2(_ROOT / own.get("", "/").lstrip("/"), name)
            else:
                group = cls._make_v1(own, name)
        except OSError:
            return None
        if group is None:
            return None
        try:
            if group.v2:
                (group.dirs["memory"] / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                    (group.dirs["memory"] / "memory.swap.max").write_text("0")
            else:
                (group.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (group.dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (group.dirs["pids"] / "pids.max").write_text(str(max_pids))
        except OSError:
            group.remove()
            return None
        return group

    @classmethod
    def _make_v2(cls, own: Path, name: str) -> GradeCgroup | None:
        # a sibling of ours under our parent (ours holds processes, so it cannot enable controllers for a child)
        parent = own.parent if own != _ROOT else _ROOT
        if not {"memory", "pids"} <= set(_read(parent / "cgroup.subtree_control").split()):
            return None
        group = parent / name
        group.mkdir()
        return cls({"memory": group, "pids": group}, v2=True)

    @classmethod
    def _make_v1(cls, own: dict[str, str], name: str) -> GradeCgroup | None:
        dirs: dict[str, Path] = {}
        for controller in ("memory", "pids"):
            base = _ROOT / controller
            if controller not in own or not (base / "cgroup.procs").is_file():
                break
            group = base / own[controller].lstrip("/") / name
            group.mkdir()
            dirs[controller] = group
        else:
            return cls(dirs, v2=False)
        for made in dirs.values():
            with contextlib.suppress(OSError):
                made.rmdir()
        return None

    def enter_argv(self) -> list[str]:
        """A command prefix that moves itself into the group, then execs the rest (no preexec_fn: rllm runs
        threads, and a fork handler in Python is not safe there)."""
        files = " ".join(f"'{d / 'cgroup.procs'}'" for d in dict.fromkeys(self.dirs.values()))
        return ["sh", "-c", f'for f in {files}; do echo $$ > "$f" || exit 125; done; exec "$@"', "sh"]

    # ------------------------------------------------------------------------------------------------ after
    def peak_memory(self) -> int:
        d = self.dirs["memory"]
        return int((_read(d / "memory.peak") if self.v2 else _read(d / "memory.max_usage_in_bytes")).strip() or 0)

    def hit(self) -> str | None:
        """Which limit the tree ran into ("memory" / "processes"), or None."""
        mem, pids = self.dirs["memory"], self.dirs["pids"]
        if self.v2:
            events = _read(mem / "memory.events")
            if _field(events, "oom_kill") or _field(events, "max"):
                return "memory"
        elif _field(_read(mem / "memory.oom_control"), "oom_kill") or int(_read(mem / "memory.failcnt") or 0):
            return "memory"
        if _field(_read(pids / "pids.events"), "max"):
            return "processes"
        return None

    def kill_all(self, wait_s: float = 5.0) -> None:
        """SIGKILL every process still in the group, until none is left (a forking tree refills it)."""
        procs = self.dirs["pids"] / "cgroup.procs"
        if self.v2 and (self.dirs["pids"] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.dirs["pids"] / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + wait_s
        while (pids := [int(p) for p in _read(procs).split()]) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        for d in dict.fromkeys(self.dirs.values()):
            for _ in range(100):  # a killed process leaves its group a moment after it is reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
