"""Run untrusted generated code in a subprocess with limits: time, memory, no network, its own directory.

Layers, each covering what the others miss:
- a fresh temp working directory, removed afterwards; `HOME` / `TMPDIR` point into it;
- `resource.setrlimit` on address space, CPU seconds, file size and core dumps (set in the child);
- an audit hook (PEP 578) in the child that refuses sockets, native-library loading, new processes (unless
  allowed) and writes outside the working directory;
- a network namespace with no interfaces (`unshare -rn`) when the kernel allows unprivileged namespaces;
- a session / process group of its own, killed as a whole (SIGKILL) on timeout and after every run, so
  nothing it started outlives it.
This stops accidents and ordinary model mistakes (infinite loops, huge allocations, stray writes); it is not
a boundary against deliberately hostile code, which needs a container or VM.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

__all__ = ["SandboxLimits", "SandboxResult", "network_isolation_available", "run_python"]

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
_MAX_OUTPUT = 64 * 1024

SandboxStatus = Literal["passed", "failed", "syntax_error", "timeout", "killed"]


class SandboxLimits(BaseModel):
    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    allow_subprocess: bool = False
    isolate_network: bool = True
    """Also use an empty network namespace when available (sockets are refused by the audit hook anyway)."""


class SandboxResult(BaseModel):
    status: SandboxStatus
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.cache
def network_isolation_available() -> bool:
    """True when `unshare -rn` works here (unprivileged user + network namespaces)."""
    try:
        out = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(_MAX_OUTPUT)


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def run_python(source: str, limits: SandboxLimits | None = None, files: dict[str, str] | None = None) -> SandboxResult:
    """Run `source` as a Python program in the sandbox; `files` are written into its directory first."""
    limits = limits or SandboxLimits()
    cfg = {"memory_mb": limits.memory_mb, "cpu_s": max(1, int(limits.timeout_s) + 1),
           "file_size_mb": limits.file_size_mb, "allow_subprocess": limits.allow_subprocess}
    with tempfile.TemporaryDirectory(prefix="rllm-sandbox-") as tmp:
        program = Path(tmp) / "program.py"
        program.write_text(source, encoding="utf-8")
        for name, text in (files or {}).items():
            target = (Path(tmp) / name).resolve()
            if not str(target).startswith(str(Path(tmp).resolve())):
                raise ValueError(f"sandbox file {name!r} would land outside the sandbox directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        cmd = [sys.executable, "-I", "-B", str(_RUNNER), str(program), json.dumps(cfg)]
        if limits.isolate_network and network_isolation_available():
            cmd = ["unshare", "-rn", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        # Output goes to files, not pipes, so the file-size limit also caps a program that prints forever.
        out_path, err_path = Path(tmp) / ".stdout", Path(tmp) / ".stderr"
        started = time.monotonic()
        with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                                    start_new_session=True)
            try:
                proc.wait(timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                timed_out = True
            finally:
                _kill_group(proc.pid)  # children it left behind die with it
        duration = time.monotonic() - started
        out, err = _head(out_path), _head(err_path)
    rc = proc.returncode
    if timed_out:
        status: SandboxStatus = "timeout"
    elif rc == 0:
        status = "passed"
    elif rc == 3 and b"SyntaxError" in (err or b""):
        status = "syntax_error"
    elif rc is not None and rc < 0:
        status = "timeout" if rc == -signal.SIGXCPU else "killed"  # SIGXCPU: the CPU-seconds limit
    else:
        status = "failed"
    return SandboxResult(status=status, returncode=rc, stdout=_decode(out), stderr=_decode(err), duration_s=duration)
