"""`rllm serve` and the vLLM launcher: flags, the not-installed error, restart on new weights, the real CLI."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from rllm_backends.local_torch.serving.vllm import VLLMServer, build_vllm_command, gateway_hint, vllm_executable
from rllm_core.cli.app import build_app
from rllm_core.errors import ConfigError, UpstreamError

VLLM_INSTALLED = shutil.which("vllm") is not None or importlib.util.find_spec("vllm") is not None

FAKE_VLLM = textwrap.dedent('''
    """Stands in for `vllm serve MODEL --host H --port P --served-model-name N ...`: /health and /v1/models."""
    import http.server, json, sys
    args = sys.argv[1:]
    model, port, name = args[0], int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
    if model.endswith("broken"):
        print("boom: cannot load", model, flush=True)
        sys.exit(3)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"status": "ok"} if self.path == "/health" else {"data": [{"id": name, "root": model}]}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


@pytest.mark.skipif(VLLM_INSTALLED, reason="checks the error shown when vLLM is missing")
def test_vllm_not_installed_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="pip install vllm"):
        vllm_executable()
    result = CliRunner().invoke(build_app(), ["serve", "--engine", "vllm", "--model", "Qwen/Qwen2.5-0.5B-Instruct"])
    assert result.exit_code == 2
    assert "vLLM is not installed" in result.output and "--engine torch" in result.output


def test_rllm_serve_unknown_model_exits_with_the_reason() -> None:
    result = CliRunner().invoke(build_app(), ["serve", "--model", "/no/such/model"])
    assert result.exit_code == 2
    assert "no model directory" in result.output and "tiny-random" in result.output


def test_vllm_command_has_the_flags_capture_and_training_need() -> None:
    cmd = build_vllm_command("Qwen/Qwen2.5-0.5B-Instruct", "127.0.0.1", 8000, executable=["vllm", "serve"],
                             extra_args=["--dtype", "bfloat16"])
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags["--port"] == "8000" and flags["--host"] == "127.0.0.1"
    assert flags["--logprobs-mode"] == "processed_logprobs" and flags["--generation-config"] == "vllm"
    assert flags["--served-model-name"] == "Qwen/Qwen2.5-0.5B-Instruct" and flags["--dtype"] == "bfloat16"
    assert gateway_hint("http://127.0.0.1:8000/v1") == "rllm gateway --upstream http://127.0.0.1:8000/v1"


def test_restart_with_weights_keeps_name_and_port_and_bumps_version(tmp_path: Path) -> None:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    ckpt = tmp_path / "step-1"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    with VLLMServer("base-model", executable=[sys.executable, str(script)], startup_timeout_s=30).start() as srv:
        url = srv.base_url
        assert httpx.get(url + "/models").json()["data"][0] == {"id": "base-model", "root": "base-model"}
        assert srv.restart_with_weights(ckpt) == 1 == srv.policy_version
        assert srv.base_url == url
        assert httpx.get(url + "/models").json()["data"][0] == {"id": "base-model", "root": str(ckpt)}
        with pytest.raises(ConfigError, match=r"no config\.json"):
            srv.restart_with_weights(tmp_path / "missing")
        assert srv.upstream_config().inject_token_ids is True


def test_vllm_that_dies_on_start_reports_its_log(tmp_path: Path) -> None:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    with pytest.raises(UpstreamError, match="boom: cannot load"):
        VLLMServer("m-broken", executable=[sys.executable, str(script)], startup_timeout_s=30).start()


@pytest.mark.slow
def test_rllm_serve_tiny_random_prints_its_url_and_serves() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rllm", "serve", "--model", "tiny-random", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1"), base_url
        assert httpx.get(base_url + "/models", timeout=10).json()["data"][0]["id"] == "tiny-random"
        r = httpx.post(base_url + "/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "rllm gateway --upstream" in err
