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

from rllm.cli.app import build_app
from rllm_core.errors import ConfigError, UpstreamError
from rllm_serve.vllm import VLLMServer, build_vllm_command, gateway_hint, vllm_executable

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

        def do_POST(self):  # vLLM's runtime LoRA endpoint: needs --enable-lora and the env switch
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            import os
            ok = self.path == "/v1/load_lora_adapter" and "--enable-lora" in args and \
                os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True" and not body["lora_path"].endswith("bad")
            self.send_response(200 if ok else 400)
            data = f"loaded {body['lora_name']} from {body['lora_path']}".encode()
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
        proc.send_signal(signal.SIGTERM)  # what process managers (and Ray) send; Ctrl-C takes the same path
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "rllm gateway --upstream" in err
    from rllm_core.cpu_features import native_bf16

    assert ("dtype bfloat16: this CPU computes bf16 natively" if native_bf16() else "dtype float32:") in err
    assert "CPU flags: " in err and "--dtype overrides" in err  # the choice is printed, with why
    assert "rllm serve: stopping (signal received)" in err  # a log says why the server ended


def test_vllm_serves_the_built_in_names_from_their_converted_directories(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm_serve import models

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m-tokenizer").symlink_to(models._tokenizer_cache())
    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    srv = VLLMServer("tiny-random", host="0.0.0.0", executable=["vllm", "serve"])
    assert srv.command[2] == str(tmp_path / "models" / "tiny-random")
    flags = dict(zip(srv.command[3::2], srv.command[4::2], strict=False))
    assert flags["--served-model-name"] == "tiny-random" and flags["--host"] == "0.0.0.0"
    assert srv.base_url == f"http://127.0.0.1:{srv.port}/v1"  # a loopback URL: the gateway injects token ids


def test_lora_adapters_hot_load_without_a_restart(tmp_path: Path) -> None:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    adapter = tmp_path / "adapter-1"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    exe = [sys.executable, str(script)]
    with VLLMServer("base", executable=exe, startup_timeout_s=30, lora=True).start() as srv:
        assert "--enable-lora" in srv.command
        pid = srv._proc.pid if srv._proc else None
        assert srv.load_lora_adapter(adapter) == 1 == srv.policy_version and srv.adapter_name == "base-v1"
        assert srv.load_lora_adapter(adapter, name="step-2") == 2 and srv.adapter_name == "step-2"
        assert srv._proc is not None and srv._proc.pid == pid  # same process: no restart
        with pytest.raises(ConfigError, match=r"adapter_config\.json"):
            srv.load_lora_adapter(tmp_path)
    with pytest.raises(ConfigError, match="lora=True"):  # refused before any request: nothing to start
        VLLMServer("base", executable=exe).load_lora_adapter(adapter)


def test_vllm_refusing_an_adapter_is_an_upstream_error(tmp_path: Path) -> None:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    adapter = tmp_path / "bad"  # the fake vLLM refuses adapters whose path ends in "bad"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with VLLMServer("base", executable=[sys.executable, str(script)], startup_timeout_s=30, lora=True).start() as srv:
        with pytest.raises(UpstreamError, match="HTTP 400"):
            srv.load_lora_adapter(adapter)
        assert srv.policy_version == 0 and srv.adapter_name is None


def test_policy_server_bound_to_all_interfaces_reports_a_loopback_url() -> None:
    from rllm_serve import load_model, start_policy_server

    with start_policy_server(load_model("tiny-random"), host="0.0.0.0") as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        assert httpx.get(srv.url + "/health", timeout=10).json()["status"] == "ok"
        up = srv.upstream_config()
        assert up.url == srv.base_url and up.inject is True


def test_importing_the_server_bounds_openmp_spinning_and_the_onednn_cache_before_torch_unless_the_user_chose(
) -> None:
    code = ("import os, sys; import rllm_serve as s; print(os.environ.get('GOMP_SPINCOUNT'), "
            "os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["20000", "32", "False"], out.stderr
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, "OMP_WAIT_POLICY": "PASSIVE", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"})
    assert out.stdout.split() == ["None", "1024", "False"], out.stderr  # the user's choices stand
