"""The `modal` sandbox provider: each sandbox is a `modal.Sandbox` of the task's image, in Modal's cloud.

The image is `modal.Image.from_dockerfile(environment/Dockerfile)` (Modal caches builds by content), or
`spec.image` / `base_image` from a registry. The sandbox gets the task's CPUs and memory as request and hard
limit, `block_network=True` unless the task allows the network, and a lifetime (`lifetime_s`) and idle timeout
(`idle_timeout_s`) after which Modal reclaims it even when the run that started it was killed. Commands run
through `sb.exec` under `timeout` (see rllm_sandboxes._archive); files move through `sb.filesystem`;
close is `sb.terminate()`.

Credentials are checked before any call: MODAL_TOKEN_ID and MODAL_TOKEN_SECRET, or a `.modal.toml`
(`modal token new` writes one; MODAL_CONFIG_PATH moves it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.sandbox import EnvironmentSpec, SandboxError
from rllm_sandboxes._archive import RemoteSandbox, find_dockerfile

__all__ = ["ModalProvider", "ModalSandbox", "modal_credentials_present"]

DEFAULT_BASE_IMAGE = "ubuntu:24.04"
_KEEP_ALIVE = ("sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done")


def _import_sdk() -> Any:
    try:
        import modal
    except ImportError:
        raise ConfigError('the modal sandbox needs the Modal SDK: pip install "rllm[modal]"') from None
    return modal


def modal_credentials_present(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Modal has a token: both environment variables, or a config file that names a token id."""
    environ = os.environ if environ is None else environ
    if environ.get("MODAL_TOKEN_ID") and environ.get("MODAL_TOKEN_SECRET"):
        return True
    config = Path(environ.get("MODAL_CONFIG_PATH") or Path(environ.get("HOME") or "~").expanduser() / ".modal.toml")
    try:
        return "token_id" in config.read_text()
    except OSError:
        return False


class ModalSandbox(RemoteSandbox):
    """One Modal sandbox (see the module docstring)."""

    provider = "modal"

    def __init__(self, sb: Any, spec: EnvironmentSpec) -> None:
        super().__init__(str(getattr(sb, "object_id", None) or id(sb)), spec)
        self._sb = sb

    def _run(self, argv: list[str], *, timeout_s: float, user: str | None, env: Mapping[str, str] | None,
             cwd: str) -> tuple[int, bytes | str]:
        # Modal's own timeout is a backstop only: `timeout` in argv kills the command's tree first.
        process = self._sb.exec(*argv, timeout=math.ceil(timeout_s) + 30, workdir=cwd,
                                env=dict(env) if env else None, text=False)
        output = process.stdout.read()
        return int(process.wait()), output

    def _write(self, path: str, data: bytes) -> None:
        self._sb.filesystem.write_bytes(data, path)

    def _read(self, path: str) -> bytes:
        return bytes(self._sb.filesystem.read_bytes(path))

    def _terminate(self) -> None:
        self._sb.terminate()


class ModalProvider:
    """Starts ModalSandboxes under the Modal app `app_name` (created when missing). `sdk`: the modal module
    (tests pass a double); `lifetime_s`: the most a sandbox lives (Modal allows up to 24 h);
    `idle_timeout_s`: Modal reclaims a sandbox idle this long (a killed run's leftovers)."""

    name = "modal"

    def __init__(self, *, sdk: Any = None, app_name: str = "rllm-sandboxes", base_image: str = DEFAULT_BASE_IMAGE,
                 lifetime_s: int = 4 * 3600, idle_timeout_s: int | None = 1800) -> None:
        self.sdk = sdk if sdk is not None else _import_sdk()
        if not modal_credentials_present():
            raise ConfigError("the modal sandbox needs Modal credentials: run `modal token new`, or set "
                              "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET")
        self.app_name = app_name
        self.base_image = base_image
        self.lifetime_s = int(lifetime_s)
        self.idle_timeout_s = idle_timeout_s
        self._app: Any = None

    def app(self) -> Any:
        if self._app is None:
            try:
                self._app = self.sdk.App.lookup(self.app_name, create_if_missing=True)
            except Exception as exc:
                raise SandboxError(f"modal: could not open the app {self.app_name!r}: {exc}") from exc
        return self._app

    def image_for(self, spec: EnvironmentSpec) -> Any:
        """The modal.Image for `spec`: its Dockerfile (context: `environment/`), its image, or `base_image`."""
        images = self.sdk.Image
        if spec.image:
            return images.from_registry(spec.image)
        dockerfile = find_dockerfile(spec)
        if dockerfile is None:
            return images.from_registry(self.base_image)
        context = spec.environment_dir if spec.environment_dir is not None else dockerfile.parent
        return images.from_dockerfile(str(dockerfile), context_dir=str(context))

    def create_options(self, spec: EnvironmentSpec) -> dict[str, Any]:
        """The keyword arguments of `modal.Sandbox.create` for `spec`."""
        res = spec.resources
        options: dict[str, Any] = {
            "timeout": self.lifetime_s, "workdir": spec.workdir, "cpu": (float(res.cpus), float(res.cpus)),
            "memory": (int(res.memory_mb), int(res.memory_mb)), "block_network": not spec.network,
        }
        if self.idle_timeout_s:
            options["idle_timeout"] = int(self.idle_timeout_s)
        if spec.env:
            options["env"] = dict(spec.env)
        return options

    def start(self, spec: EnvironmentSpec) -> ModalSandbox:
        app = self.app()
        try:
            image = self.image_for(spec)
            sb = self.sdk.Sandbox.create(*_KEEP_ALIVE, app=app, image=image, **self.create_options(spec))
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(f"task {spec.name}: could not start a Modal sandbox: {exc}") from exc
        return ModalSandbox(sb, spec).ready()
