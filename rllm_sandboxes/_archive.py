"""What the image-based providers (docker, modal, daytona) share: tar archives, the command wrapper, and a base
class that builds `Sandbox.exec/upload/download/close` from a few primitives each SDK offers.

Why tar: every SDK moves single files (or a tar stream, for Docker), but tasks upload whole directories with their
executable bits (tests/test.sh, solution/solve.sh). A tar made here and unpacked by `tar` in the sandbox keeps
the tree and the modes, the same way on all three providers.

Why the wrapper (`timeout -k 5 N sh -c ...`): SDK-side exec timeouts stop waiting but do not reliably kill what the
command started. GNU/busybox `timeout` runs the command in its own process group and signals the whole group, so
a timed-out command leaves nothing running; stderr is folded into stdout so `output` is interleaved as written.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import posixpath
import shlex
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Self, TypeVar

from rllm_core.sandbox import EnvironmentSpec, ExecResult, SandboxError

__all__ = ["MAX_OUTPUT_CHARS", "NOT_PLACED", "RemoteSandbox", "clip_output", "content_hash", "find_dockerfile",
           "pack", "pack_contents", "shell_argv", "unpack"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_OUTPUT_CHARS = 256_000
"""An exec keeps the first and last half of this many characters (a runaway `cat` must not fill the memory)."""

NOT_PLACED = frozenset({"Dockerfile", ".dockerignore", "docker-compose.yaml", "docker-compose.yml"})
"""Files of `environment/` that describe the image rather than belong in the working directory."""

KILL_AFTER_S = 5
_SHELL = 'exec 2>&1; if command -v bash >/dev/null 2>&1; then exec bash -lc "$1"; fi; exec sh -c "$1"'


def clip_output(text: str, limit: int = MAX_OUTPUT_CHARS) -> tuple[str, bool]:
    """`text`, or its head and tail around a marker when longer than `limit`; and whether it was cut."""
    if len(text) <= limit:
        return text, False
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}", True


def shell_argv(command: str, *, timeout_s: float, user: str | None = None) -> list[str]:
    """The argv that runs `command` with `bash -lc` (else `sh -c`) under `timeout`, stderr into stdout; `user`
    (for SDKs without a user option) switches with `runuser`, which images based on util-linux have."""
    run_as = ["runuser", "-u", user, "--"] if user else []
    seconds = str(max(1, math.ceil(timeout_s)))
    return ["timeout", "-k", str(KILL_AFTER_S), seconds, *run_as, "sh", "-c", _SHELL, "sh", command]


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def pack(local: Path, arcname: str) -> bytes:
    """A tar of the file or directory `local`, stored as `arcname`, owned by root, modes kept."""
    if not local.exists():
        raise SandboxError(f"cannot upload {local}: no such file or directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(local, arcname=arcname, filter=_as_root)
    return buffer.getvalue()


def pack_contents(directory: Path, exclude: frozenset[str] = NOT_PLACED) -> bytes | None:
    """A tar of what `directory` holds (top-level names in `exclude` left out); None when nothing is left."""
    entries = sorted(p for p in directory.iterdir() if p.name not in exclude)
    if not entries:
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for entry in entries:
            tar.add(entry, arcname=entry.name, filter=_as_root)
    return buffer.getvalue()


def unpack(data: bytes, local: Path) -> None:
    """Extract a tar holding one top-level entry (what `tar -C parent name` or Docker's get_archive returns) to
    `local`, replacing what is there. Unsafe members (absolute paths, `..`, device files) are refused."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        tops = {posixpath.normpath(m.name).split("/", 1)[0] for m in tar.getmembers()} - {"", "."}
        if len(tops) != 1:
            raise SandboxError(f"download: expected one file or directory in the archive, got {sorted(tops)}")
        local.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=local.parent, prefix=".rllm-download-") as tmp:
            try:
                tar.extractall(tmp, filter="data")
            except tarfile.FilterError as exc:
                raise SandboxError(f"download: refused an unsafe archive member: {exc}") from exc
            if local.is_dir() and not local.is_symlink():
                shutil.rmtree(local)
            elif local.exists() or local.is_symlink():
                local.unlink()
            shutil.move(str(Path(tmp) / tops.pop()), str(local))


def find_dockerfile(spec: EnvironmentSpec) -> Path | None:
    """The Dockerfile to build for `spec`: `spec.dockerfile`, else `environment/Dockerfile` when there is one."""
    if spec.dockerfile is not None:
        if not spec.dockerfile.is_file():
            raise SandboxError(f"task {spec.name}: Dockerfile {spec.dockerfile} does not exist")
        return spec.dockerfile
    if spec.environment_dir is not None and (spec.environment_dir / "Dockerfile").is_file():
        return spec.environment_dir / "Dockerfile"
    return None


def content_hash(dockerfile: Path, context: Path) -> str:
    """A digest of the Dockerfile and every file of its build context (names, modes, bytes): the image cache key."""
    digest = hashlib.sha256(dockerfile.read_bytes())
    for path in sorted(context.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(context)).encode() + b"\0" + oct(path.stat().st_mode).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


class RemoteSandbox:
    """A sandbox in an image-based runtime. Subclasses give `_run` (argv → exit code and output), `_write` and
    `_read` (one file's bytes) and `_terminate`; this class does the rest. `native_user`: `_run` honours `user`
    itself (Docker); otherwise the wrapper switches user with runuser."""

    native_user = False
    provider = "remote"
    scratch_dir = "/tmp"
    """Where archives wait inside the sandbox while `tar` packs or unpacks them (always removed after)."""

    def __init__(self, sandbox_id: str, spec: EnvironmentSpec) -> None:
        self.id = sandbox_id
        self.workdir = spec.workdir
        self.spec = spec
        self._closed = False

    # -- what a provider implements ---------------------------------------------------------------------------
    def _run(self, argv: list[str], *, timeout_s: float, user: str | None, env: Mapping[str, str] | None,
             cwd: str) -> tuple[int, bytes | str]:
        raise NotImplementedError

    def _write(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    def _read(self, path: str) -> bytes:
        raise NotImplementedError

    def _terminate(self) -> None:
        raise NotImplementedError

    # -- the Sandbox protocol ---------------------------------------------------------------------------------
    def exec(self, command: str, *, timeout_s: float | None = None, user: str | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None) -> ExecResult:
        if self._closed:
            raise SandboxError(f"{self.provider} sandbox {self.id} is closed")
        timeout = self.spec.resources.timeout_s if timeout_s is None else timeout_s
        argv = shell_argv(command, timeout_s=timeout, user=None if self.native_user else user)
        started = time.monotonic()
        try:
            code, raw = self._run(argv, timeout_s=timeout, user=user if self.native_user else None,
                                  env=env, cwd=self.resolve(cwd or self.workdir))
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(f"{self.provider} sandbox {self.id}: exec failed: {exc}") from exc
        duration = time.monotonic() - started
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        output, truncated = clip_output(text)
        # timeout exits 124 (TERM worked) or 137 (it needed KILL); the duration tells those from a command's own.
        timed_out = code in (124, 137) and duration >= max(1, math.ceil(timeout)) - 0.05
        return ExecResult(exit_code=code, output=output, timed_out=timed_out, duration_s=duration,
                          truncated=truncated)

    def upload(self, local: Path, remote: str) -> None:
        remote = self.resolve(remote)
        parent, name = posixpath.split(remote.rstrip("/"))
        self._extract(pack(Path(local), name), parent or "/", "upload", f"tar -xf {{tar}} -C {shlex.quote(parent)}")

    def download(self, remote: str, local: Path) -> None:
        remote = self.resolve(remote).rstrip("/") or "/"
        parent, name = posixpath.split(remote)
        tmp = self._scratch()
        q = shlex.quote(tmp)
        self.check(f"tar -cf {q} -C {shlex.quote(parent or '/')} {shlex.quote(name)} || {{ rc=$?; rm -f {q}; "
                   f"exit $rc; }}", f"download {remote}")
        try:
            data = self._guard("download", lambda: self._read(tmp))
        finally:
            self.exec(f"rm -f {q}", timeout_s=60)
        unpack(data, Path(local))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._terminate()
        except Exception as exc:  # closing must not mask the episode's own outcome; say what may be left over
            log.warning("%s sandbox %s: could not be removed (%s); remove it by hand", self.provider, self.id, exc)

    # -- helpers for providers --------------------------------------------------------------------------------
    def resolve(self, path: str) -> str:
        """`path` made absolute against the working directory."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def check(self, command: str, what: str, timeout_s: float = 600) -> ExecResult:
        """Run a setup command; SandboxError with its output when it fails."""
        result = self.exec(command, timeout_s=timeout_s, user="root" if self.native_user else None)
        if result.exit_code != 0:
            raise SandboxError(f"{self.provider} sandbox {self.id}: {what} failed (exit {result.exit_code}): "
                               f"{result.output.strip()[-2000:]}")
        return result

    def ready(self) -> Self:
        """`prepare()`d, or closed (never leaked) when preparing fails; returns the sandbox itself."""
        try:
            self.prepare()
        except BaseException:
            self.close()
            raise
        return self

    def prepare(self) -> None:
        """Create the working directory and place the files of `environment/` (all but the Dockerfile) in it,
        keeping any file the image already has there (a Dockerfile that COPYs and then edits wins)."""
        self.check(f"mkdir -p {shlex.quote(self.workdir)}", "creating the working directory")
        env_dir = self.spec.environment_dir
        exclude = NOT_PLACED | ({self.spec.dockerfile.name} if self.spec.dockerfile else set())
        data = pack_contents(env_dir, exclude) if env_dir is not None and env_dir.is_dir() else None
        if data is not None:
            w = shlex.quote(self.workdir)
            self._extract(data, self.workdir, "placing environment files",
                          f"(tar --skip-old-files -xf {{tar}} -C {w} 2>/dev/null || tar -xkf {{tar}} -C {w} "
                          f"2>/dev/null || true)")

    def _extract(self, data: bytes, parent: str, what: str, untar: str) -> None:
        tmp = self._scratch()
        self._guard(what, lambda: self._write(tmp, data))
        q = shlex.quote(tmp)
        self.check(f"command -v tar >/dev/null || {{ echo 'tar is not installed in the image'; exit 127; }}; "
                   f"mkdir -p {shlex.quote(parent)} && {untar.replace('{tar}', q)}; rc=$?; rm -f {q}; exit $rc", what)

    def _scratch(self) -> str:
        return posixpath.join(self.scratch_dir, f".rllm-{uuid.uuid4().hex}.tar")

    def _guard(self, what: str, call: Callable[[], _T]) -> _T:
        if self._closed:
            raise SandboxError(f"{self.provider} sandbox {self.id} is closed")
        try:
            return call()
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(f"{self.provider} sandbox {self.id}: {what} failed: {exc}") from exc
