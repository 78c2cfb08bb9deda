"""The docker, modal and daytona sandbox providers, against in-test doubles of the SDK calls they make.

Each double runs the commands it is given as real host processes (the sandbox's working directory is a temp dir)
and keeps files on the host, so exec, timeouts, upload/download and the placing of environment files are tested
for real; the double also records every SDK call, so the tests check the arguments (limits, network off, image).
A real Docker daemon is used only where one answers.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rllm_core.errors import ConfigError
from rllm_core.sandbox import EnvironmentSpec, Sandbox, SandboxError, SandboxResources, get_sandbox_providers
from rllm_sandboxes._archive import RemoteSandbox, clip_output, pack, shell_argv, unpack
from rllm_sandboxes.daytona.provider import DaytonaProvider
from rllm_sandboxes.docker.provider import DockerProvider, image_tag
from rllm_sandboxes.modal.provider import ModalProvider


def _host_run(argv: list[str] | str, cwd: str, env: dict[str, str] | None) -> tuple[int, bytes]:
    done = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, shell=isinstance(argv, str),
                          capture_output=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __call__(self, name: str, payload: Any = None) -> None:
        self.calls.append((name, payload))

    def named(self, name: str) -> list[Any]:
        return [payload for call, payload in self.calls if call == name]


# -- docker double ------------------------------------------------------------------------------------------------
class FakeContainer:
    def __init__(self, rec: Recorder) -> None:
        self.id, self.name, self.rec = "c0ffee", "rllm-x", rec

    def exec_run(self, cmd: list[str], *, user: str, environment: dict[str, str], workdir: str, demux: bool,
                 stream: bool) -> Any:
        self.rec("exec_run", {"cmd": cmd, "user": user, "environment": environment, "workdir": workdir})
        code, out = _host_run(cmd, workdir, environment)
        return SimpleNamespace(exit_code=code, output=out)

    def put_archive(self, path: str, data: bytes) -> bool:
        self.rec("put_archive", {"path": path, "data": data})
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(path, filter="data")
        return True

    def get_archive(self, path: str) -> tuple[Any, dict[str, Any]]:
        self.rec("get_archive", path)
        if not Path(path).exists():
            raise LookupError(f"404 Client Error: Not Found (\"Could not find the file {path} in container\")")
        return iter([pack(Path(path), Path(path).name)]), {}

    def remove(self, *, force: bool) -> None:
        self.rec("remove", {"force": force})


class FakeDockerClient:
    def __init__(self, rec: Recorder, built: set[str], fail_build: bool = False) -> None:
        self.rec, self.built, self.fail_build = rec, built, fail_build
        self.images = SimpleNamespace(get=self._get, build=self._build)
        self.containers = SimpleNamespace(run=self._run)

    def ping(self) -> bool:
        self.rec("ping")
        return True

    def _get(self, tag: str) -> Any:
        if tag not in self.built:
            raise LookupError(f"no such image {tag}")
        return SimpleNamespace(tags=[tag])

    def _build(self, **kwargs: Any) -> Any:
        self.rec("build", kwargs)
        if self.fail_build:
            error = RuntimeError("The command '/bin/sh -c false' returned a non-zero code: 1")
            error.build_log = [{"stream": "Step 2/2 : RUN false\n"}]  # type: ignore[attr-defined]
            raise error
        self.built.add(kwargs["tag"])
        return SimpleNamespace(id="sha256:1"), []

    def _run(self, image: str, **kwargs: Any) -> FakeContainer:
        self.rec("run", {"image": image, **kwargs})
        return FakeContainer(self.rec)


# -- modal double -------------------------------------------------------------------------------------------------
class FakeModalSandbox:
    def __init__(self, rec: Recorder) -> None:
        self.object_id, self.rec = "sb-1", rec
        self.filesystem = SimpleNamespace(write_bytes=self._write, read_bytes=self._read)

    def exec(self, *argv: str, timeout: int, workdir: str, env: dict[str, str] | None, text: bool) -> Any:
        self.rec("exec", {"argv": list(argv), "timeout": timeout, "workdir": workdir, "env": env, "text": text})
        code, out = _host_run(list(argv), workdir, env)
        return SimpleNamespace(stdout=io.BytesIO(out), wait=lambda: code)

    def _write(self, data: bytes, path: str) -> None:
        self.rec("write_bytes", path)
        Path(path).write_bytes(data)

    def _read(self, path: str) -> bytes:
        self.rec("read_bytes", path)
        return Path(path).read_bytes()

    def terminate(self) -> None:
        self.rec("terminate")


def fake_modal(rec: Recorder) -> Any:
    def create(*args: str, **kwargs: Any) -> FakeModalSandbox:
        rec("Sandbox.create", {"args": args, **kwargs})
        return FakeModalSandbox(rec)

    return SimpleNamespace(
        App=SimpleNamespace(lookup=lambda name, **kw: rec("App.lookup", {"name": name, **kw}) or "app"),
        Image=SimpleNamespace(from_dockerfile=lambda path, **kw: ("dockerfile-image", path, kw),
                              from_registry=lambda name: ("registry-image", name)),
        Sandbox=SimpleNamespace(create=create))


# -- daytona double -----------------------------------------------------------------------------------------------
class FakeDaytonaSandbox:
    def __init__(self, rec: Recorder) -> None:
        self.id, self.rec = "dt-1", rec
        self.process = SimpleNamespace(exec=self._exec)
        self.fs = SimpleNamespace(upload_file=self._upload, download_file=self._download)

    def _exec(self, command: str, *, cwd: str, env: dict[str, str] | None, timeout: int) -> Any:
        self.rec("process.exec", {"command": command, "cwd": cwd, "env": env, "timeout": timeout})
        code, out = _host_run(command, cwd, env)
        return SimpleNamespace(exit_code=code, result=out.decode())

    def _upload(self, data: bytes, path: str) -> None:
        self.rec("fs.upload_file", path)
        Path(path).write_bytes(data)

    def _download(self, path: str) -> bytes:
        self.rec("fs.download_file", path)
        return Path(path).read_bytes()


def fake_daytona(rec: Recorder) -> Any:
    class Client:
        def __init__(self, config: Any) -> None:
            rec("Daytona", config)

        def create(self, params: Any, *, timeout: float) -> FakeDaytonaSandbox:
            rec("create", {"params": params, "timeout": timeout})
            return FakeDaytonaSandbox(rec)

        def delete(self, sandbox: Any) -> None:
            rec("delete", sandbox.id)

    return SimpleNamespace(Daytona=Client, DaytonaConfig=lambda **kw: kw, Resources=lambda **kw: kw,
                           CreateSandboxFromImageParams=lambda **kw: kw,
                           Image=SimpleNamespace(from_dockerfile=lambda path: ("dockerfile-image", path)))


# -- fixtures -----------------------------------------------------------------------------------------------------
@pytest.fixture
def task(tmp_path: Path) -> EnvironmentSpec:
    env_dir = tmp_path / "task" / "environment"
    env_dir.mkdir(parents=True)
    (env_dir / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (env_dir / "data.txt").write_text("from the task\n")
    (env_dir / "kept.txt").write_text("task copy\n")
    (env_dir / "src").mkdir()
    (env_dir / "src" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (env_dir / "src" / "run.sh").chmod(0o755)
    workdir = tmp_path / "app"
    workdir.mkdir()
    (workdir / "kept.txt").write_text("image copy\n")  # what the image already holds: must not be overwritten
    return EnvironmentSpec(name="Hello World", environment_dir=env_dir, workdir=str(workdir),
                           resources=SandboxResources(cpus=1.5, memory_mb=512, processes=64, timeout_s=30),
                           env={"TASK_VAR": "1"})


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The doubles run on the host: archives wait in a per-test dir, which every test leaves empty."""
    path = tmp_path / "scratch"
    path.mkdir()
    monkeypatch.setattr(RemoteSandbox, "scratch_dir", str(path))
    yield path
    assert list(path.iterdir()) == [], "an archive was left in the sandbox"


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-test")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-test")
    monkeypatch.setenv("DAYTONA_API_KEY", "dtn-test")


def make(kind: str, rec: Recorder) -> Any:
    if kind == "docker":
        return DockerProvider(sdk=SimpleNamespace(from_env=lambda: rec("from_env") or FakeDockerClient(rec, set())))
    if kind == "modal":
        return ModalProvider(sdk=fake_modal(rec))
    return DaytonaProvider(sdk=fake_daytona(rec))


KINDS = ["docker", "modal", "daytona"]


# -- behaviour shared by the three providers ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_exec_output_exit_code_env_and_cwd(kind: str, task: EnvironmentSpec, creds: None, tmp_path: Path) -> None:
    sb = make(kind, Recorder()).start(task)
    assert isinstance(sb, Sandbox)
    result = sb.exec("echo out; echo err >&2; echo $FOO; pwd; exit 3", env={"FOO": "bar"})
    assert (result.exit_code, result.timed_out, result.truncated) == (3, False, False)
    assert result.output.split() == ["out", "err", "bar", task.workdir]
    (tmp_path / "app" / "sub").mkdir()
    assert sb.exec("pwd", cwd="sub").output.strip() == f"{task.workdir}/sub"
    assert sb.exec("echo $0 ${BASH_VERSION:+bash}").output.strip().endswith("bash")
    sb.close()


@pytest.mark.parametrize("kind", KINDS)
def test_timeout_kills_the_whole_tree(kind: str, task: EnvironmentSpec, creds: None, tmp_path: Path) -> None:
    sb = make(kind, Recorder()).start(task)
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    result = sb.exec(f"sleep 60 & echo $! > {pid_file}; wait", timeout_s=1)
    assert result.timed_out and result.exit_code in (124, 137)
    assert time.monotonic() - started < 15
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the background child {pid} outlived the timeout")
    fast = sb.exec("exit 124", timeout_s=20)  # a command's own 124 is not a timeout
    assert fast.exit_code == 124 and not fast.timed_out
    sb.close()


@pytest.mark.parametrize("kind", KINDS)
def test_environment_files_placed_keeping_the_image_files(kind: str, task: EnvironmentSpec, creds: None) -> None:
    sb = make(kind, Recorder()).start(task)
    workdir = Path(task.workdir)
    assert (workdir / "data.txt").read_text() == "from the task\n"
    assert (workdir / "kept.txt").read_text() == "image copy\n"
    assert not (workdir / "Dockerfile").exists()
    assert sb.exec("./src/run.sh").output == "ran\n"
    sb.close()


@pytest.mark.parametrize("kind", KINDS)
def test_upload_and_download_keep_trees_and_modes(kind: str, task: EnvironmentSpec, creds: None,
                                                  tmp_path: Path) -> None:
    sb = make(kind, Recorder()).start(task)
    tests = tmp_path / "tests"
    (tests / "lib").mkdir(parents=True)
    (tests / "test.sh").write_text("#!/bin/bash\necho ok\n")
    (tests / "test.sh").chmod(0o755)
    (tests / "lib" / "x.txt").write_text("x")
    remote = str(tmp_path / "in-sandbox" / "tests")
    sb.upload(tests, remote)
    assert sb.exec(f"{remote}/test.sh && cat {remote}/lib/x.txt").output == "ok\nx"
    sb.upload(tests / "lib" / "x.txt", "single.txt")  # relative: against the working directory
    assert (Path(task.workdir) / "single.txt").read_text() == "x"
    sb.exec("mkdir -p logs/verifier && echo 1.0 > logs/verifier/reward.txt")
    sb.download("logs", tmp_path / "got")
    assert (tmp_path / "got" / "verifier" / "reward.txt").read_text() == "1.0\n"
    sb.exec("echo hidden > .profile-x")
    sb.download(".profile-x", tmp_path / "dotfile")
    assert (tmp_path / "dotfile").read_text() == "hidden\n"
    sb.download(f"{remote}/test.sh", tmp_path / "got.sh")
    assert os.access(tmp_path / "got.sh", os.X_OK)
    with pytest.raises(SandboxError, match=r"download .*/missing failed"):
        sb.download("missing", tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists()
    with pytest.raises(SandboxError, match="no such file"):
        sb.upload(tmp_path / "absent", "x")
    sb.close()


@pytest.mark.parametrize("kind", KINDS)
def test_close_is_idempotent_and_final(kind: str, task: EnvironmentSpec, creds: None) -> None:
    rec = Recorder()
    sb = make(kind, rec).start(task)
    sb.close()
    sb.close()
    ends = {"docker": "remove", "modal": "terminate", "daytona": "delete"}[kind]
    assert len(rec.named(ends)) == 1
    with pytest.raises(SandboxError, match="closed"):
        sb.exec("true")


# -- docker -------------------------------------------------------------------------------------------------------
def test_docker_builds_by_content_hash_and_runs_with_the_task_limits(task: EnvironmentSpec, tmp_path: Path) -> None:
    rec = Recorder()
    provider = DockerProvider(client=FakeDockerClient(rec, set()))
    provider.start(task).close()
    provider.start(task).close()
    (build,) = rec.named("build")  # the second start reuses the image
    assert build["path"] == str(task.environment_dir) and build["tag"].startswith("rllm-env-hello-world:")
    assert build["dockerfile"] == str(task.environment_dir / "Dockerfile")
    run = rec.named("run")[0]
    assert run["image"] == build["tag"]
    assert run["nano_cpus"] == 1_500_000_000 and run["mem_limit"] == run["memswap_limit"] == "512m"
    assert run["pids_limit"] == 64 and run["network_mode"] == "none" and run["working_dir"] == task.workdir
    assert run["environment"] == {"TASK_VAR": "1"} and run["labels"]["rllm.sandbox"] == "1" and run["detach"]
    (task.environment_dir / "data.txt").write_text("changed\n")
    provider.start(task).close()
    assert len(rec.named("build")) == 2 and rec.named("build")[1]["tag"] != build["tag"]
    open_net = EnvironmentSpec(name="net", image="python:3.12", workdir=str(tmp_path / "app"), network=True)
    provider.start(open_net).close()
    assert rec.named("run")[-1]["image"] == "python:3.12" and "network_mode" not in rec.named("run")[-1]
    assert image_tag("A/B c", "f" * 64) == "rllm-env-a-b-c:ffffffffffffffff"


def test_docker_exec_user_and_archives(task: EnvironmentSpec, tmp_path: Path) -> None:
    rec = Recorder()
    sb = DockerProvider(client=FakeDockerClient(rec, set())).start(task)
    sb.exec("true", user="nobody", env={"A": "1"})
    call = rec.named("exec_run")[-1]
    assert call["user"] == "nobody" and call["environment"] == {"A": "1"} and call["workdir"] == task.workdir
    assert call["cmd"][:4] == ["timeout", "-k", "5", "30"] and "runuser" not in call["cmd"]
    (tmp_path / "f.sh").write_text("echo hi")
    (tmp_path / "f.sh").chmod(0o750)
    sb.upload(tmp_path / "f.sh", "/opt/x/run.sh".replace("/opt", str(tmp_path)))
    put = rec.named("put_archive")[-1]
    assert put["path"] == str(tmp_path / "x")
    with tarfile.open(fileobj=io.BytesIO(put["data"])) as tar:
        (member,) = tar.getmembers()
    assert (member.name, member.mode & 0o777, member.uid, member.uname) == ("run.sh", 0o750, 0, "root")
    sb.download(str(tmp_path / "x"), tmp_path / "back")
    assert rec.named("get_archive")[-1] == str(tmp_path / "x")
    assert (tmp_path / "back" / "run.sh").read_text() == "echo hi"
    sb.close()
    assert rec.named("remove") == [{"force": True}]


def test_docker_build_failure_names_the_dockerfile(task: EnvironmentSpec) -> None:
    provider = DockerProvider(client=FakeDockerClient(Recorder(), set(), fail_build=True))
    with pytest.raises(SandboxError, match=r"building .*Dockerfile failed.*\n.*RUN false"):
        provider.start(task)


def test_docker_without_daemon_or_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_daemon() -> Any:
        raise ConnectionError("Error while fetching server API version")

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match=r"no Docker daemon answers at unix:///nonexistent/docker.sock .*"
                                           r"start Docker .*--sandbox local"):
        DockerProvider(sdk=SimpleNamespace(from_env=no_daemon))
    monkeypatch.setitem(sys.modules, "docker", None)
    with pytest.raises(ConfigError, match=r'pip install "rllm\[docker\]"'):
        DockerProvider()


def test_docker_sdk_against_a_missing_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("docker", reason="the docker SDK is in the rllm[docker] extra")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match=r"no Docker daemon answers at unix:///nonexistent/docker\.sock"):
        DockerProvider()


def _daemon_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _daemon_answers(), reason="no Docker daemon answers here")
def test_docker_real_daemon(tmp_path: Path) -> None:
    env_dir = tmp_path / "environment"
    env_dir.mkdir()
    (env_dir / "Dockerfile").write_text("FROM busybox:1.36\nRUN mkdir -p /app && echo built > /app/image.txt\n")
    (env_dir / "asset.txt").write_text("asset\n")
    spec = EnvironmentSpec(name="real-docker", environment_dir=env_dir, resources=SandboxResources(timeout_s=20))
    sb = DockerProvider().start(spec)
    try:
        assert sb.exec("cat image.txt asset.txt").output == "built\nasset\n"
        assert sb.exec("wget -q -T 3 http://1.1.1.1 -O /dev/null").exit_code != 0  # network off
        assert sb.exec("sleep 30", timeout_s=1).timed_out
        sb.download("/app/asset.txt", tmp_path / "asset")
        assert (tmp_path / "asset").read_text() == "asset\n"
    finally:
        sb.close()
    import docker

    assert not docker.from_env().containers.list(all=True, filters={"id": sb.id})


# -- modal --------------------------------------------------------------------------------------------------------
def test_modal_create_arguments(task: EnvironmentSpec, creds: None) -> None:
    rec = Recorder()
    sb = ModalProvider(sdk=fake_modal(rec), lifetime_s=900).start(task)
    assert rec.named("App.lookup") == [{"name": "rllm-sandboxes", "create_if_missing": True}]
    (create,) = rec.named("Sandbox.create")
    assert create["image"] == ("dockerfile-image", str(task.environment_dir / "Dockerfile"),
                               {"context_dir": str(task.environment_dir)})
    assert create["cpu"] == (1.5, 1.5) and create["memory"] == (512, 512) and create["block_network"] is True
    assert create["timeout"] == 900 and create["workdir"] == task.workdir and create["env"] == {"TASK_VAR": "1"}
    assert create["args"][0] == "sh" and create["app"] == "app"
    assert sb.exec("id -un", user="nobody").output.strip() == "nobody"
    call = rec.named("exec")[-1]
    assert call["argv"][4:8] == ["runuser", "-u", "nobody", "--"] and call["text"] is False
    assert call["timeout"] > 30  # a backstop behind `timeout`
    sb.close()


def test_modal_needs_credentials_before_any_call(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    rec = Recorder()
    with pytest.raises(ConfigError, match=r"modal token new.*MODAL_TOKEN_ID"):
        ModalProvider(sdk=fake_modal(rec))
    assert rec.calls == []
    (tmp_path / ".modal.toml").write_text('[default]\ntoken_id = "ak-1"\ntoken_secret = "as-1"\n')
    ModalProvider(sdk=fake_modal(rec))
    monkeypatch.setitem(sys.modules, "modal", None)
    with pytest.raises(ConfigError, match=r'pip install "rllm\[modal\]"'):
        ModalProvider()


def test_modal_start_failure_is_a_sandbox_error(task: EnvironmentSpec, creds: None) -> None:
    sdk = fake_modal(Recorder())
    sdk.Sandbox.create = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("quota exceeded"))
    with pytest.raises(SandboxError, match="Modal sandbox: quota exceeded"):
        ModalProvider(sdk=sdk).start(task)


# -- daytona ------------------------------------------------------------------------------------------------------
def test_daytona_create_arguments(task: EnvironmentSpec, creds: None) -> None:
    rec = Recorder()
    sb = DaytonaProvider(sdk=fake_daytona(rec), create_timeout_s=120).start(task)
    assert rec.named("Daytona") == [{"api_key": "dtn-test", "api_url": None, "target": None}]
    (create,) = rec.named("create")
    params = create["params"]
    assert create["timeout"] == 120 and params["image"] == ("dockerfile-image", str(task.environment_dir /
                                                                                    "Dockerfile"))
    assert params["resources"] == {"cpu": 2, "memory": 1, "disk": 2}  # whole CPUs and GiB, rounded up
    assert params["network_block_all"] is True and params["ephemeral"] is True
    assert params["env_vars"] == {"TASK_VAR": "1"} and params["labels"]["rllm.task"] == "Hello World"
    sb.exec("echo 'quoted $HOME'")
    call = rec.named("process.exec")[-1]
    assert call["command"].startswith("timeout -k 5 30 sh -c") and call["cwd"] == task.workdir
    assert sb.exec("echo 'quoted $HOME'").output == "quoted $HOME\n"
    sb.close()
    assert rec.named("delete") == ["dt-1"]


def test_daytona_needs_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    rec = Recorder()
    with pytest.raises(ConfigError, match="DAYTONA_API_KEY"):
        DaytonaProvider(sdk=fake_daytona(rec))
    assert rec.calls == []
    DaytonaProvider(sdk=fake_daytona(rec), api_key="k")
    assert rec.named("Daytona")[0]["api_key"] == "k"
    monkeypatch.setitem(sys.modules, "daytona", None)
    with pytest.raises(ConfigError, match=r'pip install "rllm\[daytona\]"'):
        DaytonaProvider(api_key="k")


# -- helpers ------------------------------------------------------------------------------------------------------
def test_archive_helpers(tmp_path: Path) -> None:
    text, cut = clip_output("a" * 50 + "b" * 50, limit=20)
    assert cut and text.startswith("a" * 10) and text.endswith("b" * 10) and "80 characters cut" in text
    assert clip_output("short") == ("short", False)
    argv = shell_argv("echo hi", timeout_s=2.2)
    assert argv[:4] == ["timeout", "-k", "5", "3"] and argv[-1] == "echo hi"
    two = io.BytesIO()
    with tarfile.open(fileobj=two, mode="w") as tar:
        for name in ("a", "b"):
            tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    with pytest.raises(SandboxError, match="one file or directory"):
        unpack(two.getvalue(), tmp_path / "out")
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("top/../../escape"), io.BytesIO(b""))
    with pytest.raises(SandboxError, match="unsafe"):
        unpack(evil.getvalue(), tmp_path / "out")
    assert not (tmp_path.parent / "escape").exists()


def test_plugins_register_the_three_providers(creds: None) -> None:
    from rllm_core.plugins import PluginManager
    from rllm_sandboxes.daytona import plugin as daytona_plugin
    from rllm_sandboxes.docker import plugin as docker_plugin
    from rllm_sandboxes.modal import plugin as modal_plugin

    manager = PluginManager(load_entry_points=False)
    for name, module in (("docker", docker_plugin), ("modal", modal_plugin), ("daytona", daytona_plugin)):
        manager.register(module, name=name)
    specs = get_sandbox_providers(manager)
    assert {name: spec.requires for name, spec in specs.items()} == {
        "docker": "rllm[docker]", "modal": "rllm[modal]", "daytona": "rllm[daytona]"}
    assert all(spec.description for spec in specs.values())
    assert manager.infos[0].kinds == ["sandbox"]
    rec = Recorder()
    provider = specs["modal"].factory(sdk=fake_modal(rec))  # options reach the provider
    assert isinstance(provider, ModalProvider) and provider.name == "modal"
