"""The `daytona` sandbox provider: each sandbox is a Daytona sandbox of the task's image, through the Daytona SDK.

The image is `daytona.Image.from_dockerfile(environment/Dockerfile)` (Daytona builds a snapshot of it), or
`spec.image` / `base_image`. Daytona sizes in whole CPUs and GiB, so the task's limits are rounded up. The
network is blocked (`network_block_all`) unless the task allows it; sandboxes are ephemeral (deleted when they
stop) and stop after `idle_stop_min` idle minutes, so a killed run leaves nothing behind for long. Commands run
through `sandbox.process.exec` under `timeout` (see rllm_sandboxes._archive); files move through `sandbox.fs`;
close deletes the sandbox.

The API key comes from the `api_key` option or DAYTONA_API_KEY (DAYTONA_API_URL and DAYTONA_TARGET as the SDK
reads them), checked before any call.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.sandbox import EnvironmentSpec, SandboxError
from rllm_sandboxes._archive import RemoteSandbox, find_dockerfile

__all__ = ["DaytonaProvider", "DaytonaSandbox"]

DEFAULT_BASE_IMAGE = "ubuntu:24.04"


def _import_sdk() -> Any:
    try:
        import daytona
    except ImportError:
        raise ConfigError('the daytona sandbox needs the Daytona SDK: pip install "rllm[daytona]"') from None
    return daytona


class DaytonaSandbox(RemoteSandbox):
    """One Daytona sandbox (see the module docstring)."""

    provider = "daytona"

    def __init__(self, client: Any, sb: Any, spec: EnvironmentSpec) -> None:
        super().__init__(str(getattr(sb, "id", None) or id(sb)), spec)
        self._client = client
        self._sb = sb

    def _run(self, argv: list[str], *, timeout_s: float, user: str | None, env: Mapping[str, str] | None,
             cwd: str) -> tuple[int, bytes | str]:
        # process.exec takes one shell string; Daytona's own timeout is a backstop behind `timeout` in argv.
        response = self._sb.process.exec(shlex.join(argv), cwd=cwd, env=dict(env) if env else None,
                                         timeout=math.ceil(timeout_s) + 30)
        return int(response.exit_code), response.result or ""

    def _write(self, path: str, data: bytes) -> None:
        self._sb.fs.upload_file(data, path)

    def _read(self, path: str) -> bytes:
        return bytes(self._sb.fs.download_file(path))

    def _terminate(self) -> None:
        self._client.delete(self._sb)


class DaytonaProvider:
    """Starts DaytonaSandboxes. `sdk`: the daytona module (tests pass a double); `api_key` / `api_url` /
    `target`: the DaytonaConfig (None: the SDK's environment variables); `create_timeout_s`: how long creating
    (and building an image) may take; `idle_stop_min`: idle minutes before Daytona stops (and so deletes) one."""

    name = "daytona"

    def __init__(self, *, sdk: Any = None, api_key: str | None = None, api_url: str | None = None,
                 target: str | None = None, base_image: str = DEFAULT_BASE_IMAGE, create_timeout_s: float = 900,
                 idle_stop_min: int = 30) -> None:
        self.sdk = sdk if sdk is not None else _import_sdk()
        api_key = api_key or os.environ.get("DAYTONA_API_KEY")
        if not api_key:
            raise ConfigError("the daytona sandbox needs a Daytona API key: set DAYTONA_API_KEY (from "
                              "https://app.daytona.io/dashboard/keys) or pass api_key")
        self.base_image = base_image
        self.create_timeout_s = create_timeout_s
        self.idle_stop_min = idle_stop_min
        try:
            self.client = self.sdk.Daytona(self.sdk.DaytonaConfig(api_key=api_key, api_url=api_url, target=target))
        except Exception as exc:
            raise SandboxError(f"daytona: could not set up the client: {exc}") from exc

    def image_for(self, spec: EnvironmentSpec) -> Any:
        """A registry image name, or `daytona.Image.from_dockerfile` of the task's Dockerfile."""
        if spec.image:
            return spec.image
        dockerfile = find_dockerfile(spec)
        return self.base_image if dockerfile is None else self.sdk.Image.from_dockerfile(str(dockerfile))

    def create_params(self, spec: EnvironmentSpec) -> Any:
        """The `CreateSandboxFromImageParams` for `spec` (limits rounded up to Daytona's units)."""
        res = spec.resources
        resources = self.sdk.Resources(cpu=max(1, math.ceil(res.cpus)), memory=max(1, math.ceil(res.memory_mb / 1024)),
                                       disk=max(1, math.ceil(res.disk_mb / 1024)))
        return self.sdk.CreateSandboxFromImageParams(
            image=self.image_for(spec), resources=resources, env_vars=dict(spec.env) or None,
            labels={"rllm.sandbox": "1", "rllm.task": spec.name}, network_block_all=not spec.network,
            ephemeral=True, auto_stop_interval=int(self.idle_stop_min))

    def start(self, spec: EnvironmentSpec) -> DaytonaSandbox:
        try:
            sb = self.client.create(self.create_params(spec), timeout=self.create_timeout_s)
        except SandboxError:
            raise
        except Exception as exc:
            raise SandboxError(f"task {spec.name}: could not start a Daytona sandbox: {exc}") from exc
        return DaytonaSandbox(self.client, sb, spec).ready()
