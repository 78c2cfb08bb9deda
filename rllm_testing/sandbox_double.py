"""A sandbox provider double for tests of code that USES sandboxes (episodes, agents, verifiers).

`SubprocessSandboxProvider` implements the `SandboxProvider` / `Sandbox` protocols of `rllm_core.sandbox` with
plain subprocesses: each sandbox is a temporary host directory holding `app/` (standing for the workdir, filled
from the task's `environment/` files other than the Dockerfile), `tests/`, `logs/` and `tmp/`. Sandbox paths under
the workdir, `/tests`, `/logs` and `/tmp` are mapped to those folders, in `upload`/`download`/`cwd` and, by plain
text substitution, in commands (so `cat /app/out.txt` works).

THIS IS NOT A SANDBOX: there is NO isolation (commands run as the test's own user, with network, and may write
anywhere a path is not mapped). It exists so tests run fast and without bubblewrap/Docker, and it records every
call (`sandbox.calls`, `provider.started`) so a test can assert what the code under test did.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_core.sandbox import EnvironmentSpec, ExecResult, SandboxError

__all__ = ["RecordedCall", "SubprocessSandbox", "SubprocessSandboxProvider"]

_OUTPUT_LIMIT = 1_000_000


@dataclass(frozen=True)
class RecordedCall:
    """One call a test double received: `method` ("exec", "upload", "download", "close") and its arguments."""

    method: str
    args: dict[str, Any] = field(default_factory=dict)


class SubprocessSandbox:
    """One "sandbox" of `SubprocessSandboxProvider` (see the module docstring: no isolation)."""

    def __init__(self, spec: EnvironmentSpec, host_dir: Path) -> None:
        self.id = f"double-{spec.name}-{uuid.uuid4().hex[:8]}"
        self.spec = spec
        self.workdir = spec.workdir
        self.host_dir = host_dir
        self.calls: list[RecordedCall] = []
        self.closed = False
        self._roots: dict[str, Path] = {self.workdir.rstrip("/") or "/": host_dir / "app",
                                         "/tests": host_dir / "tests", "/logs": host_dir / "logs",
                                         "/tmp": host_dir / "tmp"}
        for path in self._roots.values():
            path.mkdir(parents=True, exist_ok=True)
        # Longest root first, so /app/x does not match a shorter root that is its prefix.
        names = sorted(self._roots, key=len, reverse=True)
        self._pattern = re.compile(r"(?<![\w.\-/])(" + "|".join(re.escape(n) for n in names) + r")(?=[/\s'\";:)]|$)")

    # -- path mapping ----------------------------------------------------------------------------------------------

    def host_path(self, remote: str) -> Path:
        """The host path standing for sandbox path `remote` (relative paths are under the workdir)."""
        if not remote.startswith("/"):
            remote = f"{self.workdir.rstrip('/')}/{remote}"
        norm = os.path.normpath(remote)
        for root, host in sorted(self._roots.items(), key=lambda kv: len(kv[0]), reverse=True):
            if norm == root or norm.startswith(root + "/"):
                return host / os.path.relpath(norm, root)
        raise SandboxError(f"path {remote!r} is outside the mapped roots of the sandbox double "
                           f"({', '.join(sorted(self._roots))})")

    def _map_command(self, command: str) -> str:
        return self._pattern.sub(lambda m: str(self._roots[m.group(1)]), command)

    # -- the Sandbox protocol --------------------------------------------------------------------------------------

    def exec(self, command: str, *, timeout_s: float | None = None, user: str | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None) -> ExecResult:
        """Run `command` with bash in the mapped cwd; the whole process group is killed at the timeout."""
        self.calls.append(RecordedCall("exec", {"command": command, "timeout_s": timeout_s, "user": user,
                                                "env": dict(env or {}), "cwd": cwd}))
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        timeout = timeout_s if timeout_s is not None else self.spec.resources.timeout_s
        run_env = {**os.environ, **self.spec.env, **(env or {}), "HOME": str(self._roots["/tmp"])}
        start = time.monotonic()
        proc = subprocess.Popen(["bash", "-c", self._map_command(command)], cwd=self.host_path(cwd or self.workdir),
                                env=run_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(65536), b"")),
                                  daemon=True)  # type: ignore[union-attr]
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        # Background children of a finished command die with it, as in the real providers.
        _kill_group(proc.pid)
        proc.wait()
        reader.join(timeout=5)
        raw = b"".join(chunks)
        truncated = len(raw) > _OUTPUT_LIMIT
        if truncated:
            half = _OUTPUT_LIMIT // 2
            raw = raw[:half] + b"\n...[output truncated]...\n" + raw[-half:]
        code = 124 if timed_out else proc.returncode
        return ExecResult(exit_code=code, output=raw.decode("utf-8", "replace"), timed_out=timed_out,
                          duration_s=time.monotonic() - start, truncated=truncated)

    def upload(self, local: Path, remote: str) -> None:
        self.calls.append(RecordedCall("upload", {"local": Path(local), "remote": remote}))
        target = self.host_path(remote)
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(local).is_dir():
            shutil.copytree(local, target, dirs_exist_ok=True)
        else:
            shutil.copy2(local, target)

    def download(self, remote: str, local: Path) -> None:
        self.calls.append(RecordedCall("download", {"remote": remote, "local": Path(local)}))
        source = self.host_path(remote)
        if not source.exists():
            raise SandboxError(f"{remote!r} does not exist in sandbox {self.id}")
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, local, dirs_exist_ok=True)
        else:
            shutil.copy2(source, local)

    def close(self) -> None:
        self.calls.append(RecordedCall("close"))
        if not self.closed:
            self.closed = True
            shutil.rmtree(self.host_dir, ignore_errors=True)


class SubprocessSandboxProvider:
    """Starts `SubprocessSandbox`es under `root` (a fresh temp dir by default); `started` lists them in order."""

    name = "subprocess-double"

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="rllm-sandbox-double-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.started: list[SubprocessSandbox] = []
        self.specs: list[EnvironmentSpec] = []

    def start(self, spec: EnvironmentSpec) -> SubprocessSandbox:
        self.specs.append(spec)
        host_dir = Path(tempfile.mkdtemp(prefix=f"{_safe(spec.name)}-", dir=self.root))
        sandbox = SubprocessSandbox(spec, host_dir)
        if spec.environment_dir is not None and Path(spec.environment_dir).is_dir():
            for item in Path(spec.environment_dir).iterdir():
                if item.name == "Dockerfile":
                    continue
                target = host_dir / "app" / item.name
                if item.is_dir():
                    shutil.copytree(item, target, dirs_exist_ok=True)
                else:
                    shutil.copy2(item, target)
        self.started.append(sandbox)
        return sandbox

    def close_all(self) -> None:
        """Close every sandbox started (a test's teardown)."""
        for sandbox in self.started:
            sandbox.close()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "task"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
