"""`rllm model setup` / `show`: flags and prompts, where the file goes, keys kept out of it unless asked."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.errors import ConfigError, UpstreamError
from rllm_envs.eval.endpoint import open_endpoint
from rllm_envs.eval.model_config import ModelConfig, config_path, load_model_config, save_model_config

runner = CliRunner()


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_config_path_rllm_home_then_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_path() == tmp_path / "home" / "config.json"
    monkeypatch.delenv("RLLM_HOME")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "rllm" / "config.json"


def test_setup_with_flags_keeps_key_out_of_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-secret-1234")
    res = runner.invoke(build_app(), ["model", "setup", "--kind", "api", "--base-url", "https://api.example.com/v1",
                                      "--model", "gpt-x", "--api-key-env", "MY_KEY"])
    assert res.exit_code == 0, res.output
    text = config_path().read_text()
    assert "sk-secret" not in text
    cfg = load_model_config()
    assert cfg is not None and cfg.kind == "api" and cfg.resolve_api_key() == "sk-secret-1234"
    shown = runner.invoke(build_app(), ["model", "show", "--json"])
    info = json.loads(shown.output)
    assert info["api_key"] == "from $MY_KEY (set)" and "sk-secret" not in shown.output


def test_setup_interactive_prompts() -> None:
    res = runner.invoke(build_app(), ["model", "setup"], input="2\nhttp://127.0.0.1:8000/v1\nmy-model\n")
    assert res.exit_code == 0, res.output
    cfg = load_model_config()
    assert cfg == ModelConfig(kind="server", base_url="http://127.0.0.1:8000/v1", model="my-model")


def test_store_key_only_when_asked() -> None:
    res = runner.invoke(build_app(), ["model", "setup", "--kind", "api", "--base-url", "https://x.example/v1",
                                      "--model", "m", "--store-key"], input="sk-stored-9999\n")
    assert res.exit_code == 0, res.output
    assert "sk-stored-9999" in config_path().read_text()
    assert stat.S_IMODE(config_path().stat().st_mode) == 0o600
    shown = runner.invoke(build_app(), ["model", "show"])
    assert "sk-stored-9999" not in shown.output and "****9999" in shown.output


def test_bad_setup_and_bad_file(_home: Path) -> None:
    res = runner.invoke(build_app(), ["model", "setup", "--kind", "server", "--model", "m"])
    assert res.exit_code == 2 and "--base-url" in res.output
    res = runner.invoke(build_app(), ["model", "setup", "--kind", "cloud"])
    assert res.exit_code == 2 and "embedded, server or api" in res.output
    _home.mkdir(parents=True, exist_ok=True)
    (_home / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json cannot be read"):
        load_model_config()


def test_show_when_unconfigured() -> None:
    res = runner.invoke(build_app(), ["model", "show", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["configured"] is False


def test_eval_endpoint_uses_configured_server(fake_upstream) -> None:  # type: ignore[no-untyped-def]
    save_model_config(ModelConfig(kind="server", base_url=fake_upstream.base_url, model="served"))
    with open_endpoint(None, None) as ep:
        assert (ep.base_url, ep.model, ep.source) == (fake_upstream.base_url, "served", "config")
    save_model_config(ModelConfig(kind="server", base_url="http://127.0.0.1:9/v1", model="x"))
    with pytest.raises(UpstreamError, match=r"127\.0\.0\.1:9/v1 is not reachable"), open_endpoint(None, None):
        pass


def test_stored_key_is_dropped_when_setup_runs_again_without_it() -> None:
    save_model_config(ModelConfig(kind="api", base_url="https://x.example/v1", model="m", api_key="sk-old-1111"))
    assert stat.S_IMODE(config_path().stat().st_mode) == 0o600
    save_model_config(ModelConfig(kind="api", base_url="https://x.example/v1", model="m", api_key_env="K"))
    assert "sk-old" not in config_path().read_text()
    assert [p.name for p in config_path().parent.iterdir()] == ["config.json"]  # no temp file left behind


def test_setup_interactive_embedded_asks_which_model() -> None:
    res = runner.invoke(build_app(), ["model", "setup"], input="1\ntiny-random\n")
    assert res.exit_code == 0, res.output
    assert load_model_config() == ModelConfig(kind="embedded", model="tiny-random")
    res = runner.invoke(build_app(), ["model", "setup", "--kind", "embedded"], input="\n")
    assert res.exit_code == 0 and load_model_config() == ModelConfig(kind="embedded", model="smollm2-135m")


def test_setup_server_offers_the_served_model_and_says_when_nothing_answers(fake_upstream) -> None:  # type: ignore[no-untyped-def]
    res = runner.invoke(build_app(), ["model", "setup"], input=f"2\n{fake_upstream.base_url}\n\n")
    assert res.exit_code == 0, res.output
    assert "it serves fake-model" in res.output
    assert load_model_config() == ModelConfig(kind="server", base_url=fake_upstream.base_url, model="fake-model")
    res = runner.invoke(build_app(), ["model", "setup", "--kind", "server", "--base-url", "http://127.0.0.1:9/v1"])
    assert res.exit_code == 0 and "could not list the models at http://127.0.0.1:9/v1 (" in " ".join(res.output.split())
    res = runner.invoke(build_app(), ["model", "setup", "--kind", "server", "--base-url", fake_upstream.base_url,
                                      "--model", "other"])
    assert res.exit_code == 0 and "does not list 'other' (it serves fake-model)" in " ".join(res.output.split())


def test_a_saved_default_model_name_becomes_the_one_the_server_lists(fake_upstream) -> None:  # type: ignore[no-untyped-def]
    save_model_config(ModelConfig(kind="server", base_url=fake_upstream.base_url, model="default"))
    with open_endpoint(None, None) as ep:
        assert ep.model == "fake-model"


def _fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_model_config_does_not_import_the_eval_engine() -> None:
    """`rllm model` probes a server with the address helpers (rllm_core.net), not through the eval engine: the
    eval package's face resolves its names lazily, so importing model_config loads no other eval module."""
    out = _fresh_python("import sys, rllm_envs.eval.model_config; "
                        "print(sorted(m for m in sys.modules if m.startswith(('rllm_envs', 'rllm_rollout'))))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['rllm_envs', 'rllm_envs.eval', 'rllm_envs.eval.model_config']"


@pytest.mark.parametrize("module", ["rllm_envs.eval.model_config", "rllm_envs.eval.endpoint", "rllm_core.net",
                                    "rllm_envs.eval"])
def test_each_module_imports_alone(module: str) -> None:
    out = _fresh_python(f"import {module}")
    assert out.returncode == 0, out.stderr


def test_the_probe_is_one_function_wherever_it_is_imported_from() -> None:
    import rllm_core.net
    import rllm_envs.eval
    import rllm_envs.eval.endpoint

    assert rllm_envs.eval.check_reachable is rllm_envs.eval.endpoint.check_reachable is rllm_core.net.check_reachable
    with pytest.raises(UpstreamError, match=r"model endpoint http://127.0.0.1:9/v1 is not reachable"):
        rllm_core.net.check_reachable("http://127.0.0.1:9/v1", timeout_s=2.0)


def test_building_the_cli_does_not_load_the_eval_engine() -> None:
    """The CLI registers `rllm eval` at start-up (every command, `rllm model` too): the engine, the model stack and
    torch load only when `rllm eval` runs, not when the app is built."""
    out = _fresh_python("import sys, typer.main; from rllm.cli.app import build_app; "
                        "typer.main.get_command(build_app()); "
                        "print(sorted(m for m in ('rllm_envs.eval.runner', 'rllm_rollout.engine', 'torch') "
                        "if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
