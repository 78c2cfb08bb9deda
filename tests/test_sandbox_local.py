"""The `local` sandbox provider (bubblewrap), against the real thing: isolation, limits, lifecycle, file moves,
and the refusals. Needs `bwrap` (CI installs bubblewrap); each test runs in well under a second or two."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rllm_core.errors import ConfigError
from rllm_core.plugins import PluginManager
from rllm_core.sandbox import EnvironmentSpec, SandboxError, SandboxResources, get_sandbox_providers
from rllm_sandboxes.local import LocalSandbox, LocalSandboxProvider, lifecycle
from rllm_sandboxes.local import plugin as local_plugin
from rllm_sandboxes.local.plugin import rllm_register_sandbox_providers
from rllm_sandboxes.local.proc import processes_of_uid
from rllm_testing.sandbox_double import SubprocessSandboxProvider


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """A root the sandbox uids can reach (pytest's tmp_path is 0700 when running as root)."""
    root = Path(tempfile.mkdtemp(prefix="rllm-sandbox-test-"))
    root.chmod(0o711)
    yield root / "sandboxes"
    lifecycle.remove_tree(root)


@pytest.fixture
def provider(sandbox_root: Path) -> LocalSandboxProvider:
    return LocalSandboxProvider(root=sandbox_root)


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    env = tmp_path / "environment"
    (env / "pkg").mkdir(parents=True)
    (env / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (env / "data.txt").write_text("hello\n")
    (env / "pkg" / "mod.py").write_text("X = 1\n")
    return env


@pytest.fixture
def sandbox(provider: LocalSandboxProvider, env_dir: Path) -> Iterator[LocalSandbox]:
    sb = provider.start(EnvironmentSpec(name="t", environment_dir=env_dir, env={"TASK_VAR": "v1"},
                                        resources=SandboxResources(timeout_s=20)))
    yield sb
    sb.close()


def _pids_running(needle: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmd:
                found.append(int(entry.name))
    return found


# -- isolation -----------------------------------------------------------------------------------------------------

def test_no_network_even_to_host_loopback(sandbox: LocalSandbox) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        r = sandbox.exec(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"")
        assert r.exit_code != 0
        assert "ConnectionRefused" in r.output or "unreachable" in r.output.lower()
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing ever reached the host's listener
    r = sandbox.exec("cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net")
    assert r.output.split()[-1] == "lo" or "lo" in r.output.split()


def test_writes_outside_the_writable_roots_do_not_reach_the_host(sandbox: LocalSandbox, tmp_path: Path) -> None:
    name = f"rllm_probe_{uuid.uuid4().hex[:8]}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    repo = Path(__file__).resolve().parent
    targets = [f"/etc/{name}", f"/usr/{name}", f"/{name}", f"/root/{name}", f"{elsewhere}/{name}",
               f"{sandbox.host_dir}/{name}", f"{repo}/{name}"]
    r = sandbox.exec("; ".join(f"echo x > {t} 2>/dev/null && echo WROTE {t}" for t in targets) + "; true")
    assert r.exit_code == 0
    for target in targets:
        assert not Path(target).exists(), target
    # /root is the sandbox's own home (so tools can write dotfiles): it lands in the sandbox dir, not the host's.
    assert f"WROTE /root/{name}" in r.output and (sandbox.host_dir / "home" / name).exists()
    assert "WROTE /etc" not in r.output and "WROTE /usr" not in r.output
    # The host's private places are not even visible.
    r = sandbox.exec(f"ls {tmp_path}; echo; ls /home /run; ls /root")
    assert "No such file" in r.output and r.output.splitlines()[-1] == name
    assert "/home:\n\n/run:\n" in r.output


def test_the_callers_environment_does_not_leak_in(sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_TEST_SECRET", "sk-do-not-leak")
    r = sandbox.exec("env")
    assert "sk-do-not-leak" not in r.output and "TASK_VAR=v1" in r.output and "HOME=/root" in r.output


# -- limits ----------------------------------------------------------------------------------------------------------

def test_fork_bomb_is_contained(provider: LocalSandboxProvider, env_dir: Path) -> None:
    before = len(_pids_running(""))
    spec = EnvironmentSpec(name="bomb", environment_dir=env_dir, resources=SandboxResources(processes=40))
    with provider.start(spec) as sb:
        start = time.monotonic()
        r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout_s=2.5)
        assert time.monotonic() - start < 10
        assert r.timed_out or r.exit_code != 0
        if sb._slot is not None:
            assert processes_of_uid(sb.host_uid) == []
        assert sb.exec("echo alive").output == "alive\n"  # the sandbox's count came back
    assert len(_pids_running("")) <= before + 5


def test_memory_hog_is_killed(provider: LocalSandboxProvider, env_dir: Path) -> None:
    spec = EnvironmentSpec(name="mem", environment_dir=env_dir, resources=SandboxResources(memory_mb=512))
    with provider.start(spec) as sb:
        r = sb.exec("python3 -c 'x = bytearray(4 * 1024**3); print(len(x))'")
        assert r.exit_code != 0 and "MemoryError" in r.output and not r.timed_out


def test_timeout_kills_the_whole_tree(sandbox: LocalSandbox) -> None:
    marker = f"1000.{uuid.uuid4().int % 10**6}"
    r = sandbox.exec(f"sleep {marker} & sleep {marker}", timeout_s=0.5)
    assert r.timed_out and r.exit_code == 124 and r.duration_s < 5
    assert _pids_running(f"sleep {marker}") == []
    # A finished command's background children go too (each command is its own pid namespace).
    r = sandbox.exec(f"sleep {marker} > /dev/null 2>&1 & echo started")
    assert r.output == "started\n" and not r.timed_out and r.duration_s < 5
    assert _pids_running(f"sleep {marker}") == []


def test_close_leaves_no_process_and_no_directory(provider: LocalSandboxProvider, env_dir: Path) -> None:
    sb = provider.start(EnvironmentSpec(name="close", environment_dir=env_dir))
    marker = f"999.{uuid.uuid4().int % 10**6}"
    results = []
    worker = threading.Thread(target=lambda: results.append(sb.exec(f"sleep {marker}", timeout_s=60)))
    worker.start()
    deadline = time.monotonic() + 5
    while not _pids_running(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _pids_running(f"sleep {marker}")
    assert sb in lifecycle.live_sandboxes()
    sb.close()
    worker.join(10)
    assert not worker.is_alive() and results and results[0].exit_code != 0
    assert _pids_running(f"sleep {marker}") == []
    assert not sb.host_dir.exists() and sb not in lifecycle.live_sandboxes()
    if sb._slot is not None:
        assert processes_of_uid(sb.host_uid) == []
    sb.close()  # twice is fine
    with pytest.raises(SandboxError, match="closed"):
        sb.exec("true")


def test_output_is_interleaved_and_truncated_head_and_tail(sandbox_root: Path, env_dir: Path) -> None:
    provider = LocalSandboxProvider(root=sandbox_root, output_limit=1000)
    with provider.start(EnvironmentSpec(name="out", environment_dir=env_dir)) as sb:
        r = sb.exec("echo out; echo err >&2; echo out2")
        assert r.output == "out\nerr\nout2\n" and not r.truncated
        r = sb.exec("echo FIRST; head -c 200000 /dev/zero | tr '\\0' x; echo; echo LAST")
        assert r.truncated and r.output.startswith("FIRST") and r.output.rstrip().endswith("LAST")
        assert len(r.output) < 1100


# -- files, env, cwd, users -------------------------------------------------------------------------------------------

def test_environment_files_env_cwd_exit_codes_and_users(sandbox: LocalSandbox) -> None:
    assert sandbox.workdir == "/app"
    r = sandbox.exec("pwd; cat data.txt pkg/mod.py; ls -a /app")
    assert r.output.startswith("/app\nhello\nX = 1\n") and "Dockerfile" not in r.output
    assert sandbox.exec("exit 7").exit_code == 7
    assert sandbox.exec("echo $TASK_VAR $EXTRA", env={"TASK_VAR": "v2", "EXTRA": "e"}).output == "v2 e\n"
    assert sandbox.exec("pwd", cwd="pkg").output == "/app/pkg\n"
    assert sandbox.exec("pwd", cwd="/tests").output == "/tests\n"
    assert sandbox.exec("id -u").output == "0\n"
    assert sandbox.exec("id -u", user="agent").output == "1000\n"
    assert sandbox.exec("id -u; touch /app/by_agent && echo ok", user="1234").output == "1234\nok\n"


def test_upload_download_round_trip(sandbox: LocalSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "deep").mkdir(parents=True)
    (src / "deep" / "a.txt").write_text("A")
    (src / "b.bin").write_bytes(bytes(range(256)))
    sandbox.upload(src, "/tests/suite")
    sandbox.upload(src / "deep" / "a.txt", "notes/a.txt")  # relative: under the workdir
    r = sandbox.exec("cat /tests/suite/deep/a.txt /app/notes/a.txt; ln -s /etc/hostname /logs/link; "
                     "mkdir /logs/d && echo L > /logs/d/l.txt")
    assert r.output.startswith("AA")
    sandbox.download("/tests/suite", tmp_path / "back")
    assert (tmp_path / "back" / "deep" / "a.txt").read_text() == "A"
    assert (tmp_path / "back" / "b.bin").read_bytes() == bytes(range(256))
    sandbox.download("/logs/d/l.txt", tmp_path / "l.txt")
    assert (tmp_path / "l.txt").read_text() == "L\n"
    sandbox.download("/logs", tmp_path / "logs")
    assert (tmp_path / "logs" / "link").is_symlink()  # kept as a link, never followed on the host
    with pytest.raises(SandboxError, match="no such file"):
        sandbox.download("/logs/missing", tmp_path / "m")
    for bad in ("/etc/passwd", "/usr/x"):
        with pytest.raises(SandboxError, match="writable roots: /app, /logs, /root, /tests, /tmp"):
            sandbox.download(bad, tmp_path / "x")
        with pytest.raises(SandboxError, match="writable roots"):
            sandbox.upload(src, bad)


def test_upload_through_a_symlink_the_sandbox_made_cannot_write_the_host(sandbox: LocalSandbox,
                                                                         tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    name = f"rllm_probe_{uuid.uuid4().hex[:8]}"
    sandbox.exec(f"ln -s {outside} /app/evil; ln -s /etc /app/evil_etc")
    payload = tmp_path / "payload"
    (payload / "evil").mkdir(parents=True)
    (payload / "evil" / name).write_text("x")
    (payload / "evil_etc").mkdir()
    (payload / "evil_etc" / name).write_text("x")
    with contextlib.suppress(SandboxError):  # tar, inside, may refuse or replace the links: either is fine
        sandbox.upload(payload, "/app")
    assert not (outside / name).exists() and not Path("/etc", name).exists()


def test_dockerfile_workdir_env_and_copy_are_honoured(provider: LocalSandboxProvider, tmp_path: Path) -> None:
    env = tmp_path / "env"
    (env / "src").mkdir(parents=True)
    (env / "src" / "main.py").write_text("print('hi')\n")
    (env / "unused.txt").write_text("not copied\n")
    (env / "Dockerfile").write_text("# comment\nFROM python:3.11-slim\nLABEL a=b\nWORKDIR /work\n"
                                    "ENV A=1 B=\"two words\"\nENV LEGACY some value\nCOPY src/ ./code/\n"
                                    "COPY src/main.py /tests/\n")
    with provider.start(EnvironmentSpec(name="df", environment_dir=env)) as sb:
        assert sb.workdir == "/work"
        r = sb.exec("pwd; echo $A $B $LEGACY; python3 code/main.py; ls /work; cat /tests/main.py")
        assert r.output == "/work\n1 two words some value\nhi\ncode\nprint('hi')\n"


# -- refusals --------------------------------------------------------------------------------------------------------

def test_refuses_what_it_cannot_honour(provider: LocalSandboxProvider, tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.mkdir()
    (env / "Dockerfile").write_text("FROM ubuntu\nRUN apt-get update && \\\n  apt-get install -y jq\n")
    with pytest.raises(ConfigError, match=r"(?s)Dockerfile:2.*RUN.*--sandbox docker"):
        provider.start(EnvironmentSpec(name="run", environment_dir=env))
    (env / "Dockerfile").write_text("FROM ubuntu\nCOPY --from=build /x /app\n")
    with pytest.raises(ConfigError, match="--sandbox docker"):
        provider.start(EnvironmentSpec(name="stage", environment_dir=env))
    (env / "Dockerfile").write_text("FROM ubuntu\nCOPY Dockerfile /usr/local/bin/\n")
    with pytest.raises(ConfigError, match=r"cannot COPY to '/usr/local/bin/'.*--sandbox docker"):
        provider.start(EnvironmentSpec(name="copy", environment_dir=env))
    with pytest.raises(ConfigError, match=r"network.*--sandbox docker"):
        provider.start(EnvironmentSpec(name="net", network=True))
    with pytest.raises(ConfigError, match=r"cannot run images.*--sandbox docker"):
        provider.start(EnvironmentSpec(name="img", image="python:3.11"))
    with pytest.raises(ConfigError, match="workdir"):
        provider.start(EnvironmentSpec(name="wd", workdir="/usr/share/rllm_nope"))
    missing = LocalSandboxProvider(root=tmp_path / "sb")
    missing.bwrap = ""
    with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        missing.start(EnvironmentSpec(name="nobwrap"))
    assert not any(p.name != ".uids" for p in (tmp_path / "sb").glob("*")) if (tmp_path / "sb").exists() else True


def test_stale_directories_of_a_dead_process_are_swept(provider: LocalSandboxProvider, env_dir: Path) -> None:
    provider.root.mkdir(parents=True)
    stale = provider.root / "dead-abc"
    (stale / "app").mkdir(parents=True)
    (stale / ".owner").write_text("")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    with provider.start(EnvironmentSpec(name="fresh", environment_dir=env_dir)) as sb:
        assert not stale.exists() and sb.host_dir.exists()


# -- plugin and double -------------------------------------------------------------------------------------------------

def test_plugin_registers_the_local_provider(tmp_path: Path) -> None:
    (spec,) = rllm_register_sandbox_providers()
    assert spec.name == "local" and spec.requires is None and "bubblewrap" in spec.description
    manager = PluginManager(load_entry_points=False)  # the hookimpl matches the hookspec
    manager.register(local_plugin, name="sandbox_local")
    built = get_sandbox_providers(manager)["local"].factory(root=tmp_path / "sb")
    assert isinstance(built, LocalSandboxProvider) and built.name == "local"


def test_subprocess_double_maps_paths_and_records_calls(env_dir: Path, tmp_path: Path) -> None:
    double = SubprocessSandboxProvider(root=tmp_path / "double")
    sb = double.start(EnvironmentSpec(name="d", environment_dir=env_dir, env={"K": "v"}))
    r = sb.exec("cat /app/data.txt; echo $K; echo t > /tmp/t.txt; exit 3")
    assert r.exit_code == 3 and r.output == "hello\nv\n"
    sb.download("/tmp/t.txt", tmp_path / "t.txt")
    assert (tmp_path / "t.txt").read_text() == "t\n"
    assert sb.exec("sleep 5", timeout_s=0.2).timed_out
    sb.close()
    assert [c.method for c in sb.calls] == ["exec", "download", "exec", "close"] and not sb.host_dir.exists()


def test_sigterm_of_the_run_closes_its_sandboxes(sandbox_root: Path) -> None:
    script = ("import sys, time, threading\n"
              "from rllm_core.sandbox import EnvironmentSpec\n"
              "from rllm_sandboxes.local import LocalSandboxProvider\n"
              f"sb = LocalSandboxProvider(root={str(sandbox_root)!r}).start(EnvironmentSpec(name='term'))\n"
              "threading.Thread(target=sb.exec, args=('sleep 987.6',), daemon=True).start()\n"
              "print(sb.host_dir, sb.host_uid, flush=True)\n"
              # a run's main thread wakes often (its event loop); CPython runs a handler only in the main thread,
              # so a SIGTERM the kernel gives the exec thread waits for the main thread's next bytecode: one long
              # sleep would hide the handler for its whole length (seen: the child outlived the 60 s bound)
              "for _ in range(600):\n    time.sleep(0.1)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        host_dir, uid = child.stdout.readline().split()
        deadline = time.monotonic() + 5
        while not _pids_running("sleep 987.6") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert Path(host_dir).is_dir() and _pids_running("sleep 987.6")
        child.send_signal(signal.SIGTERM)
        # still dies of SIGTERM, after cleaning up (bound generous: under a loaded full-suite run it once took >10 s)
        assert child.wait(60) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
    assert not Path(host_dir).exists() and _pids_running("sleep 987.6") == []
    if os.getuid() == 0:
        assert processes_of_uid(int(uid)) == []
