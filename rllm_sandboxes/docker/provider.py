"""The `docker` sandbox provider: each sandbox is a container of the task's image, through the docker Python SDK.

The image is the task's `environment/Dockerfile` built once per content (tagged `rllm-env-<task>:<hash>`, so a
changed Dockerfile or asset rebuilds and an unchanged one is reused), or `spec.image`, or `base_image`. The
container gets the task's limits (CPUs, memory without swap, a process cap), no network unless the task allows
it, `no-new-privileges`, an init process that reaps orphans, and a label `rllm.sandbox=1` so leftovers of a
killed run can be found (`docker ps -a --filter label=rllm.sandbox`). Commands run through `exec_run` under
`timeout` (see rllm_sandboxes._archive); files move with put_archive/get_archive; close removes the container.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import shlex
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.sandbox import EnvironmentSpec, SandboxError
from rllm_sandboxes._archive import RemoteSandbox, content_hash, find_dockerfile, pack, unpack

__all__ = ["DockerProvider", "DockerSandbox", "image_tag"]

DEFAULT_BASE_IMAGE = "ubuntu:24.04"
_KEEP_ALIVE = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


def _import_sdk() -> Any:
    try:
        import docker
    except ImportError:
        raise ConfigError('the docker sandbox needs the docker SDK: pip install "rllm[docker]"') from None
    return docker


def _daemon_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _slug(task: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", task.lower()).strip("-._")[:64] or "task"


def image_tag(task: str, digest: str) -> str:
    """A valid Docker tag for `task`'s image of content `digest`."""
    return f"rllm-env-{_slug(task)}:{digest[:16]}"


class DockerSandbox(RemoteSandbox):
    """One container (see the module docstring)."""

    native_user = True
    provider = "docker"

    def __init__(self, container: Any, spec: EnvironmentSpec) -> None:
        super().__init__(str(getattr(container, "id", None) or container.name), spec)
        self._container = container

    def _run(self, argv: list[str], *, timeout_s: float, user: str | None, env: Mapping[str, str] | None,
             cwd: str) -> tuple[int, bytes | str]:
        result = self._container.exec_run(argv, user=user or "", environment=dict(env or {}), workdir=cwd,
                                          demux=False, stream=False)
        return int(result.exit_code), result.output or b""

    def _write(self, path: str, data: bytes) -> None:
        parent, name = posixpath.split(path)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_bytes(data)
            self._put(parent, pack(Path(tmp) / name, name))

    def _read(self, path: str) -> bytes:
        with tarfile.open(fileobj=io.BytesIO(self._get(path)), mode="r:*") as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            if handle is None:
                raise SandboxError(f"docker sandbox {self.id}: {path} is not a file")
            return handle.read()

    def _terminate(self) -> None:
        self._container.remove(force=True)

    def upload(self, local: Path, remote: str) -> None:
        """put_archive into the parent directory (created first): the Docker daemon unpacks the tar itself."""
        remote = self.resolve(remote)
        parent, name = posixpath.split(remote.rstrip("/"))
        data = pack(Path(local), name)
        self.check(f"mkdir -p {shlex.quote(parent or '/')}", f"upload {remote}")
        self._guard(f"upload {remote}", lambda: self._put(parent or "/", data))

    def download(self, remote: str, local: Path) -> None:
        remote = self.resolve(remote)
        unpack(self._guard(f"download {remote}", lambda: self._get(remote)), Path(local))

    def _put(self, parent: str, data: bytes) -> None:
        if not self._container.put_archive(parent, data):
            raise SandboxError(f"docker sandbox {self.id}: the daemon refused the archive for {parent}")

    def _get(self, path: str) -> bytes:
        stream, _stat = self._container.get_archive(path)
        return b"".join(stream)


class DockerProvider:
    """Starts DockerSandboxes. `client`: a docker client (default `docker.from_env()`); `sdk`: the docker module
    (tests pass a double); `base_image`: the image of tasks with neither a Dockerfile nor an image."""

    name = "docker"

    def __init__(self, *, client: Any = None, sdk: Any = None, base_image: str = DEFAULT_BASE_IMAGE) -> None:
        self.base_image = base_image
        if client is None:
            sdk = sdk if sdk is not None else _import_sdk()
            try:
                client = sdk.from_env()
                client.ping()
            except Exception as exc:
                raise SandboxError(f"no Docker daemon answers at {_daemon_address()} ({exc}): start Docker "
                                   "(or set DOCKER_HOST) or use --sandbox local") from exc
        self.client = client
        self._build_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def image_for(self, spec: EnvironmentSpec) -> str:
        """The image to run for `spec`, built (once per content, also across concurrent episodes) if needed."""
        if spec.image:
            return spec.image
        dockerfile = find_dockerfile(spec)
        if dockerfile is None:
            return self.base_image
        context = spec.environment_dir if spec.environment_dir is not None else dockerfile.parent
        tag = image_tag(spec.name, content_hash(dockerfile, context))
        with self._locks_guard:
            lock = self._build_locks.setdefault(tag, threading.Lock())
        with lock:
            try:
                self.client.images.get(tag)
                return tag
            except Exception:  # not built yet (ImageNotFound); a dead daemon fails the build below, loudly
                pass
            try:
                self.client.images.build(path=str(context), dockerfile=str(dockerfile.resolve()), tag=tag, rm=True,
                                         forcerm=True, pull=False)
            except Exception as exc:
                log_lines = [str(chunk.get("stream", "")).rstrip() for chunk in getattr(exc, "build_log", [])
                             if isinstance(chunk, dict) and chunk.get("stream")]
                tail = "\n".join(log_lines[-20:])
                raise SandboxError(f"task {spec.name}: building {dockerfile} failed: {exc}"
                                   + (f"\n{tail}" if tail else "")) from exc
        return tag

    def run_options(self, spec: EnvironmentSpec) -> dict[str, Any]:
        """The keyword arguments of `containers.run` for `spec` (limits, network, workdir, labels)."""
        res = spec.resources
        memory = f"{int(res.memory_mb)}m"
        options: dict[str, Any] = {
            "entrypoint": _KEEP_ALIVE[:1], "command": _KEEP_ALIVE[1:], "detach": True,
            "name": f"rllm-{_slug(spec.name)[:40]}-{uuid.uuid4().hex[:8]}",
            "working_dir": spec.workdir, "environment": dict(spec.env), "labels": {"rllm.sandbox": "1",
                                                                                 "rllm.task": spec.name},
            "nano_cpus": int(res.cpus * 1e9), "mem_limit": memory, "memswap_limit": memory,
            "pids_limit": int(res.processes), "init": True, "security_opt": ["no-new-privileges"],
        }
        if not spec.network:
            options["network_mode"] = "none"
        return options

    def start(self, spec: EnvironmentSpec) -> DockerSandbox:
        image = self.image_for(spec)
        try:
            container = self.client.containers.run(image, **self.run_options(spec))
        except Exception as exc:
            raise SandboxError(f"task {spec.name}: could not start a container of {image}: {exc}") from exc
        return DockerSandbox(container, spec).ready()
