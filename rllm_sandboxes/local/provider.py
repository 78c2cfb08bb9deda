"""The `local` sandbox provider: each command runs under bubblewrap (`bwrap`), on the host's read-only system.

Layout. Each sandbox is a host directory `<root>/<task>-XXXX/` holding `app/` (bound at the task's workdir, filled
from `environment/`), `tests/` (/tests), `logs/` (/logs), `tmp/` (/tmp) and `home/` (/root). Nothing else inside
is writable: the sandbox's `/` is a read-only tmpfs with the host's system folders (/usr, /etc, /opt, /var, ...)
bound read-only; the host's /root, /home, /tmp, /run, /mnt, /media, /boot and any other top-level folder (the
user's projects, credentials, sockets) are not there at all.

Isolation per command: `bwrap --unshare-all` gives fresh user, pid, network (no interface but its own loopback:
no network at all), ipc, uts and cgroup namespaces; `--die-with-parent` and the pid namespace make every process of
the command die with it (a `sleep 1000 &` does not outlive its command; background servers do not persist between
`exec` calls, unlike `docker exec`). The caller's environment is not passed in (no API keys leak): a sandbox sees
PATH, HOME=/root, LANG, the Dockerfile's ENV, the spec's env and the call's env.

Limits (setrlimit through `prlimit`): address space = memory_mb (a 4 GB allocation fails with MemoryError),
processes = processes, CPU seconds ~ the timeout, file size = disk_mb (per file; total disk is not capped).
`cpus` is not enforced (no cgroups needed, none used). RLIMIT_NPROC counts per real uid and root is exempt, so when
rllm runs as root each sandbox runs as its own unprivileged host uid/gid from a pool (200000 + slot, held with a
lock file across processes), its directory chown'ed to it: a fork bomb hits its own limit, and sandboxes never
share a count. As a normal user, sandboxes run as that user (nproc is then the user's count + `processes`).

Users inside: the `user` argument of `exec` picks the uid seen INSIDE the sandbox's user namespace. None (the
default) or "root" is uid 0: tasks written for Docker images expect root, and here root is only root of the
namespace: it maps to the sandbox's unprivileged host uid and cannot write the read-only system. A number is that
uid; any other name is uid 1000 (the host's /etc/passwd is used, so names of image users do not exist here).

Commands run as `bash -c COMMAND` (not a login shell: /etc/profile of the host would reset the PATH the task set).
`upload`/`download` go through `tar`/`cat` run INSIDE the sandbox, so symlinks a command made resolve in the
sandbox's view and can never make the host write or read outside the sandbox.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import shlex
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from rllm_core.errors import ConfigError
from rllm_core.sandbox import EnvironmentSpec, ExecResult, SandboxError
from rllm_sandboxes.local import lifecycle
from rllm_sandboxes.local.dockerfile import parse_dockerfile
from rllm_sandboxes.local.proc import OutputCapture, UidSlot, acquire_uid_slot, kill_group, kill_uid, processes_of_uid

__all__ = ["DEFAULT_RO_PATHS", "LocalSandbox", "LocalSandboxProvider"]

DEFAULT_RO_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/nix", "/sys")
"""Host paths bound read-only into every sandbox (missing ones skipped; symlinks such as /bin -> usr/bin kept).
Not /opt, /var, /srv: other task sets, venvs, datasets and unix sockets (docker.sock) live there; pass `ro_paths`
to add what a task set needs."""

_INSTALL_HINT = ("install bubblewrap: `apt-get install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` "
                 "(Fedora), or your distro's package; or choose another provider with `--sandbox docker`")
_TIMEOUT_EXIT = 124
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _root_of(remote: str, roots: Sequence[str]) -> str | None:
    for root in sorted(roots, key=len, reverse=True):
        if remote == root or remote.startswith(root.rstrip("/") + "/"):
            return root
    return None


class LocalSandbox:
    """One bubblewrap sandbox (see the module docstring). Built by `LocalSandboxProvider.start`."""

    def __init__(self, provider: LocalSandboxProvider, spec: EnvironmentSpec, host_dir: Path, workdir: str,
                 env: Mapping[str, str], slot: UidSlot | None, lock_fd: int) -> None:
        self.id = host_dir.name
        self.workdir = workdir
        self.spec = spec
        self.host_dir = host_dir
        self.env = dict(env)
        self.closed = False
        self._provider = provider
        self._slot = slot
        self._lock_fd: int | None = lock_fd
        self._live: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self.address_space_mb: int | None = None
        """Raise the address-space limit of later commands above `memory_mb` (a Node program's WebAssembly reserves
        gigabytes of address space it never touches); None: `memory_mb`."""
        self.mounts: list[tuple[Path, str]] = []
        """Host folders bound read-only (`mount_ro`): a harness's installed program, its relay's sockets."""
        self.roots: dict[str, Path] = {workdir: host_dir / "app", "/tests": host_dir / "tests",
                                       "/logs": host_dir / "logs", "/tmp": host_dir / "tmp",
                                       "/root": host_dir / "home"}
        """Writable sandbox paths and the host folders behind them."""

    @property
    def host_uid(self) -> int:
        """The host uid every process of this sandbox runs as."""
        return self._slot.uid if self._slot is not None else os.getuid()

    # -- command line ----------------------------------------------------------------------------------------------

    def _limits(self, timeout: float) -> list[str]:
        res = self.spec.resources
        nproc = res.processes
        if self._slot is None:  # sharing the caller's uid: the limit counts the caller's processes too
            nproc += len(processes_of_uid(os.getuid(), zombies=True))
        cpu = math.ceil(timeout * max(1.0, res.cpus)) + 1
        memory_mb = max(res.memory_mb, self.address_space_mb or 0)
        wanted = {"as": (resource.RLIMIT_AS, memory_mb * 1024 * 1024), "nproc": (resource.RLIMIT_NPROC, nproc),
                  "cpu": (resource.RLIMIT_CPU, cpu), "fsize": (resource.RLIMIT_FSIZE, res.disk_mb * 1024 * 1024)}
        args = [self._provider.prlimit]
        for name, (which, value) in wanted.items():
            hard = resource.getrlimit(which)[1]  # never ask for more than we have: prlimit would fail
            args.append(f"--{name}={value if hard == resource.RLIM_INFINITY else min(value, hard)}")
        return [*args, "--"]

    def _argv(self, script: str, *, user: str | None, cwd: str, timeout: float) -> list[str]:
        ns_uid = _ns_uid(user)
        argv = [*self._limits(timeout), self._provider.bwrap, "--unshare-all", "--unshare-user",
                "--uid", str(ns_uid), "--gid", str(ns_uid), "--hostname", "rllm-sandbox",
                "--die-with-parent", "--new-session"]
        if ns_uid == 0:  # lets root map itself into a nested user namespace (Linux ≥ 5.12 asks for CAP_SETFCAP in
            argv += ["--cap-add", "CAP_SETFCAP"]  # the parent): a verifier's `unshare` hides /tests from agent code
        for path in self._provider.ro_paths:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                argv += ["--ro-bind", path, path]
        for hidden in self.spec.hidden:  # the task's own folder (tests/, solution/) under a bound system path
            real = os.path.realpath(hidden)
            if any(real == p or real.startswith(p.rstrip("/") + "/") for p in self._provider.ro_paths) and \
                    os.path.isdir(real):
                argv += ["--tmpfs", real]
        argv += ["--proc", "/proc", "--dev", "/dev", "--dir", "/run", "--dir", "/home"]
        for host, remote in self.mounts:
            argv += ["--ro-bind", str(host), remote]
        for remote, host in sorted(self.roots.items(), key=lambda kv: len(kv[0])):
            argv += ["--bind", str(host), remote]
        argv += ["--remount-ro", "/", "--chdir", cwd, "--", "/bin/bash", "-c", script]
        return argv

    def _popen(self, script: str, *, user: str | None, cwd: str, timeout: float, env: Mapping[str, str] | None,
               stdin: Any = subprocess.DEVNULL, stdout: Any = subprocess.PIPE,
               stderr: Any = subprocess.STDOUT) -> subprocess.Popen[bytes]:
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        run_env = {**self.env, **(env or {})}
        ids: dict[str, Any] = {}
        if self._slot is not None:
            ids = {"user": self._slot.uid, "group": self._slot.gid, "extra_groups": []}
        argv = self._argv(script, user=user, cwd=cwd, timeout=timeout)
        with self._lock:  # so a finishing exec's leftover sweep never kills a command starting now
            try:
                proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=run_env, cwd="/",
                                        close_fds=True, start_new_session=True, **ids)
            except OSError as exc:
                raise SandboxError(f"sandbox {self.id}: cannot start bwrap: {exc}") from exc
            self._live.add(proc)
        return proc

    def _finish(self, proc: subprocess.Popen[bytes], timeout: float) -> bool:
        """Wait up to `timeout`; kill the whole tree either way. True when it timed out."""
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:  # Ctrl-C while waiting: the command must not outlive us
            kill_group(proc.pid)
            proc.wait()
            self._live.discard(proc)
            raise
        kill_group(proc.pid)
        proc.wait()
        with self._lock:
            self._live.discard(proc)
            if self._slot is None or self._live:
                return timed_out
            # bwrap's monitor exits as soon as the command does; the namespace's last processes (a killed fork
            # bomb) may take a moment to die. Make sure none is left when exec returns.
            kill_uid(self._slot.uid)
        return timed_out

    # -- the Sandbox protocol --------------------------------------------------------------------------------------

    def exec(self, command: str, *, timeout_s: float | None = None, user: str | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None) -> ExecResult:
        """Run `command` with `bash -c`; output is stdout+stderr interleaved, head+tail kept past the limit."""
        timeout = float(timeout_s if timeout_s is not None else self.spec.resources.timeout_s)
        where = self._abs(cwd or self.workdir)
        start = time.monotonic()
        proc = self._popen(command, user=user, cwd=where, timeout=timeout, env=env)
        assert proc.stdout is not None
        capture = OutputCapture(proc.stdout, self._provider.output_limit)
        timed_out = self._finish(proc, timeout)
        output, truncated = capture.result()
        code = _TIMEOUT_EXIT if timed_out else proc.returncode
        return ExecResult(exit_code=code, output=output, timed_out=timed_out,
                          duration_s=time.monotonic() - start, truncated=truncated)

    def mount_ro(self, host: Path, remote: str) -> None:
        """Bind host folder `host` read-only at `remote` for every later command (a harness's program, installed
        once on the host, instead of copied into each sandbox). `remote` must lie outside the writable roots."""
        path = self._abs(remote)
        if path == "/" or _root_of(path, list(self.roots)) is not None or any(
                path == p or path.startswith(p.rstrip("/") + "/") for p in ("/proc", "/dev", *self._provider.ro_paths)):
            raise SandboxError(f"cannot mount {host} at {remote!r}: pick a path outside the sandbox's writable "
                               f"roots ({', '.join(sorted(self.roots))}) and its system folders, e.g. /opt/NAME")
        if not Path(host).exists():
            raise SandboxError(f"cannot mount {host}: it does not exist")
        if self._slot is not None:  # the sandbox's own uid opens the bind source
            _check_traversable(Path(host))
        self.mounts.append((Path(host), path))

    def unmount(self, remote: str) -> None:
        """Undo `mount_ro(…, remote)` for later commands (the verifier never sees a harness's folders)."""
        path = self._abs(remote)
        self.mounts = [(h, r) for h, r in self.mounts if r != path]

    def upload(self, local: Path, remote: str) -> None:
        """Copy a local file or directory (its contents merge into `remote`) to a writable path inside."""
        local = Path(local)
        if not local.exists():
            raise SandboxError(f"upload: {local} does not exist")
        target = self._writable(remote)
        is_dir = local.is_dir()
        into = target if is_dir else os.path.dirname(target) or "/"
        script = (f"mkdir -p -- {shlex.quote(into)} && "
                  f"exec /usr/bin/tar -x -f - -C {shlex.quote(into)} --no-same-owner --no-overwrite-dir")
        with tempfile.TemporaryFile() as errors:
            proc = self._popen(script, user=None, cwd="/", timeout=self._io_timeout, env=None,
                               stdin=subprocess.PIPE, stdout=errors, stderr=errors)
            assert proc.stdin is not None
            try:
                with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                    tar.add(local, arcname="." if is_dir else os.path.basename(target), filter=_as_root)
            except BrokenPipeError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            timed_out = self._finish(proc, self._io_timeout)
            if timed_out or proc.returncode != 0:
                why = "timed out" if timed_out else _read(errors)
                raise SandboxError(f"upload {local} -> {remote} failed in sandbox {self.id}: {why}")

    def download(self, remote: str, local: Path) -> None:
        """Copy a file or directory from a writable path inside to `local` (symlinks inside stay symlinks)."""
        local = Path(local)
        source = self._writable(remote)
        q = shlex.quote(source)
        script = (f"if [ -d {q} ]; then printf D; exec /usr/bin/tar -c -f - -C {q} .; "
                  f"elif [ -e {q} ]; then printf F; exec cat -- {q}; "
                  f"else echo \"no such file or directory: {source}\" >&2; exit 2; fi")
        local.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as data:
            proc = self._popen(script, user=None, cwd="/", timeout=self._io_timeout, env=None,
                               stdout=data, stderr=errors)
            timed_out = self._finish(proc, self._io_timeout)
            if timed_out or proc.returncode != 0:
                raise SandboxError(f"download {remote} from sandbox {self.id} failed: "
                                   f"{'timed out' if timed_out else _read(errors)}")
            data.seek(0)
            kind = data.read(1)
            if kind == b"F":
                with open(local, "wb") as out:
                    shutil.copyfileobj(data, out)
                return
            local.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=data, mode="r|") as tar:
                tar.extractall(local, filter="tar")

    def close(self) -> None:
        """Kill every process left, remove the host directory, free the uid. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for proc in list(self._live):
            kill_group(proc.pid)
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        self._live.clear()
        if self._slot is not None:
            kill_uid(self._slot.uid)
        lifecycle.remove_tree(self.host_dir)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        if self._slot is not None:
            self._slot.release()
        lifecycle.unregister(self)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- paths -----------------------------------------------------------------------------------------------------

    @property
    def _io_timeout(self) -> float:
        return max(60.0, self.spec.resources.timeout_s)

    def _abs(self, path: str) -> str:
        return os.path.normpath(path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}")

    def _writable(self, remote: str) -> str:
        path = self._abs(remote)
        if _root_of(path, list(self.roots)) is None:
            raise SandboxError(f"path {remote!r} is not in a writable place of the local sandbox; writable roots: "
                               f"{', '.join(sorted(self.roots))}")
        return path

    def host_path(self, remote: str) -> Path:
        """The host path behind sandbox path `remote` (for inspection in tests and logs; do not write to it)."""
        path = self._writable(remote)
        root = _root_of(path, list(self.roots))
        assert root is not None
        return self.roots[root] / os.path.relpath(path, root)


class LocalSandboxProvider:
    """Starts `LocalSandbox`es. Options: `root` (where sandbox dirs live; default <tmp>/rllm-sandboxes),
    `output_limit` (bytes kept per command), `uid_base`/`uid_pool` (the host uids used when running as root),
    `ro_paths` (host paths bound read-only)."""

    name = "local"

    def __init__(self, *, root: str | Path | None = None, output_limit: int = 1_000_000, uid_base: int = 200_000,
                 uid_pool: int = 4096, ro_paths: Sequence[str] = DEFAULT_RO_PATHS) -> None:
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir()) / "rllm-sandboxes"
        self.output_limit = int(output_limit)
        self.uid_base = int(uid_base)
        self.uid_pool = int(uid_pool)
        self.ro_paths = tuple(ro_paths)
        real_root = os.path.realpath(self.root)
        inside = [p for p in self.ro_paths if real_root == p or real_root.startswith(p.rstrip("/") + "/")]
        if inside:  # every sandbox would see (and, as one uid, reach) the others' /tests and /app
            raise ConfigError(f"the local sandbox root {self.root} lies under {inside[0]}, which sandboxes see "
                              "read-only: set TMPDIR (or pass root=) to a folder outside the bound system paths")
        self.bwrap = shutil.which("bwrap") or ""
        self.prlimit = shutil.which("prlimit") or ""

    def _check_tools(self) -> None:
        if not self.bwrap:
            raise ConfigError(f"the local sandbox needs bubblewrap (`bwrap`), which is not on PATH; {_INSTALL_HINT}")
        if not self.prlimit:
            raise ConfigError("the local sandbox needs `prlimit` (util-linux): `apt-get install util-linux`")
        if not shutil.which("tar", path="/usr/bin"):
            raise ConfigError("the local sandbox needs /usr/bin/tar (for upload/download): `apt-get install tar`")

    def start(self, spec: EnvironmentSpec) -> LocalSandbox:
        """Refuse what cannot be honoured (network, a system-changing Dockerfile), then lay out and probe."""
        if spec.network:
            raise ConfigError(f"task {spec.name!r} needs network access; the local sandbox has no network at all "
                              "(by design); run it with `--sandbox docker`")
        dockerfile = spec.dockerfile
        if dockerfile is None and spec.environment_dir is not None:
            candidate = Path(spec.environment_dir) / "Dockerfile"
            dockerfile = candidate if candidate.is_file() else None
        context = Path(spec.environment_dir) if spec.environment_dir is not None else (
            Path(dockerfile).parent if dockerfile is not None else None)
        plan = parse_dockerfile(Path(dockerfile), context or Path(dockerfile).parent,
                                default_workdir=spec.workdir) if dockerfile is not None else None
        if spec.image and plan is None:
            raise ConfigError(f"task {spec.name!r} asks for image {spec.image!r}; the local sandbox runs on the "
                              "host's system and cannot run images; run it with `--sandbox docker`")
        workdir = os.path.normpath(plan.workdir if plan and plan.workdir else spec.workdir)
        self._check_workdir(workdir)
        self._check_tools()
        lifecycle.sweep_stale(self.root)
        host_dir, lock_fd = lifecycle.make_sandbox_dir(self.root, spec.name)
        slot: UidSlot | None = None
        sandbox: LocalSandbox | None = None
        try:
            if os.getuid() == 0:
                _check_traversable(self.root)
                slot = acquire_uid_slot(self.root / ".uids", self.uid_base, self.uid_pool)
            env = {"PATH": _PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", "USER": "root",
                   **(plan.env if plan else {}), **spec.env}
            sandbox = LocalSandbox(self, spec, host_dir, workdir, env, slot, lock_fd)
            for host in sandbox.roots.values():
                host.mkdir(parents=True, exist_ok=True)
            self._populate(sandbox, plan, context)
            if slot is not None:
                lifecycle.chown_tree(host_dir, slot.uid, slot.gid)
            lifecycle.register(sandbox)
            probe = sandbox.exec("true", timeout_s=30)
            if probe.exit_code != 0:
                raise SandboxError(f"bubblewrap could not start a sandbox for {spec.name!r}: {probe.output.strip()} "
                                   "(if it says 'No permissions to create new namespace' or 'Operation not "
                                   "permitted', unprivileged user namespaces are disabled: `sysctl -w "
                                   "kernel.unprivileged_userns_clone=1`, and on Ubuntu 24.04+ "
                                   "`kernel.apparmor_restrict_unprivileged_userns=0`)")
            return sandbox
        except BaseException:
            if sandbox is not None:
                sandbox.close()
            else:
                lifecycle.remove_tree(host_dir)
                os.close(lock_fd)
                if slot is not None:
                    slot.release()
            raise

    def _check_workdir(self, workdir: str) -> None:
        if not workdir.startswith("/") or workdir == "/":
            raise ConfigError(f"workdir {workdir!r} must be an absolute path below / (e.g. /app)")
        top = "/" + workdir.strip("/").split("/")[0]
        reserved = {"/tests", "/logs", "/tmp", "/root", "/proc", "/dev", "/run", "/home"}
        if top in reserved or (top in self.ro_paths and not os.path.isdir(workdir)):
            raise ConfigError(f"the local sandbox cannot use workdir {workdir!r} (it would sit inside {top}, which "
                              "is read-only or reserved there); use a top-level folder such as /app, or "
                              "`--sandbox docker`")

    def _populate(self, sandbox: LocalSandbox, plan: Any, context: Path | None) -> None:
        """Place the task's files: the Dockerfile's COPYs if it has any (Docker's semantics), else every file of
        `environment/` but the Dockerfile into the workdir. Runs before any sandbox process exists."""
        if plan is not None and plan.copies:
            for sources, dest in plan.copies:
                for source in sources:
                    # Docker: a directory's contents go to dest; a file goes into dest/ or becomes dest.
                    target = dest + source.name if dest.endswith("/") and not source.is_dir() else dest
                    try:
                        host = sandbox.host_path(target)
                    except SandboxError as exc:
                        raise ConfigError(f"the local sandbox cannot COPY to {dest!r} (only the workdir, /tests, "
                                          "/logs, /tmp and /root are writable); use `--sandbox docker`") from exc
                    _copy(source, host)
        elif context is not None and context.is_dir():
            for item in sorted(context.iterdir()):
                if item.name != "Dockerfile":
                    _copy(item, sandbox.roots[sandbox.workdir] / item.name)


def _check_traversable(root: Path) -> None:
    """Sandbox uids must reach `root` (bwrap opens the bind sources as them): every folder above it needs o+x."""
    for folder in [root.resolve(), *root.resolve().parents]:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            raise ConfigError(f"{root} is not reachable by the sandbox uids: {folder} lacks o+x "
                              f"(`chmod o+x {folder}`), or pick another place (sandbox `root`, RLLM_HOME)")


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


def _ns_uid(user: str | None) -> int:
    if user is None or user in ("root", "0"):
        return 0
    if user.isdigit():
        return int(user)
    return 1000


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _read(fh: IO[bytes]) -> str:
    fh.seek(0)
    return fh.read()[-4000:].decode("utf-8", "replace").strip()
