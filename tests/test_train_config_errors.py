"""Mistakes in a training config read as one line that says what to change: an unknown key names the
closest real option, a file that does not parse gives its line, and `rllm train --help` shows a default
for every option that has one (and never "None")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.errors import ConfigError
from rllm_train.config import TrainConfig, load_config
from rllm_train.plugin import _algo_text, _steps

runner = CliRunner()


def test_unknown_key_suggests_the_option(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("group_size: 2\nbatch_sise: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == "invalid training config: unknown option 'batch_sise' (did you mean batch_size?)"


def test_validator_messages_are_one_line_without_pydantic_prefix() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, group_size=1)
    text = str(info.value)
    assert "\n" not in text and "Value error" not in text and "--group-size 2 or more" in text


def test_several_problems_share_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, lr=-1, top_p=2)
    assert "\n" not in str(info.value) and "lr: " in str(info.value) and "top_p: " in str(info.value)


@pytest.mark.parametrize(("name", "text", "where"), [("bad.yaml", "a: [\n", "YAML: line 2, column 1"),
                                                    ("bad.toml", "a = \n", "TOML: ")])
def test_unparsable_file_is_one_line_with_its_position(tmp_path: Path, name: str, text: str, where: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "\n" not in str(info.value) and where in str(info.value)


def test_help_shows_real_defaults_and_every_option_has_help() -> None:
    res = runner.invoke(build_app(), ["train", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "(default: None)" not in res.output and "[default: None]" not in res.output
    assert re.search(r"--group-size .*Attempts per task.*\[default: 4\]", res.output)
    for name, field in TrainConfig.model_fields.items():
        assert field.description, f"TrainConfig.{name} has no docstring, so `--help` would show nothing for it"


def test_header_words() -> None:
    assert _algo_text({"solver": "grpo", "*": "reinforce"}) == "solver=grpo,*=reinforce"
    assert _algo_text("rloo") == "rloo"
    assert (_steps(1), _steps(3)) == ("1 step", "3 steps")


def test_resume_refuses_other_weights_before_touching_the_run(tmp_path: Path) -> None:
    from rllm_train.loop import _check_resume_config
    from rllm_train.rundir import RunDir

    run = RunDir(tmp_path).create()
    TrainConfig(model="tiny-random", output=str(tmp_path)).dump_yaml(run.config_file)
    before = run.config_file.read_text()
    _check_resume_config(run, TrainConfig(model="tiny-random", output=str(tmp_path), max_steps=9))  # fine
    with pytest.raises(ConfigError, match=r"model 'tiny-random' → 'smollm2-135m', lora_rank 0 → 4"):
        _check_resume_config(run, TrainConfig(model="smollm2-135m", lora_rank=4, output=str(tmp_path)))
    assert run.config_file.read_text() == before


def test_checkpoint_of_another_model_is_one_line() -> None:
    import torch

    from rllm_backends.local_torch.checkpoint_io import check_fits

    own = {"a": torch.zeros(2, 3), "b": torch.zeros(1)}
    check_fits(own, dict(own), Path("ckpt"))
    with pytest.raises(ConfigError) as info:
        check_fits(own, {"a": torch.zeros(2, 5), "c": torch.zeros(1)}, Path("ckpt"))
    text = str(info.value)
    assert "\n" not in text and "1 weights missing, 1 unexpected, 1 of another shape" in text
    assert "a is (2, 5) there, (2, 3) here" in text


def test_resume_with_no_step_left_says_so(tmp_path: Path) -> None:
    from rllm_train.loop import _check_resume_config
    from rllm_train.rundir import RunDir

    run = RunDir(tmp_path).create()
    TrainConfig(output=str(tmp_path)).dump_yaml(run.config_file)
    (run.checkpoints_dir / "step_3").mkdir()
    (run.checkpoints_dir / "step_3" / "state.json").write_text('{"step": 3}')
    (run.checkpoints_dir / "latest").write_text("step_3")
    with pytest.raises(ConfigError, match=r"already at step 3, so --max-steps 3 .*pass --max-steps 4 or more"):
        _check_resume_config(run, TrainConfig(output=str(tmp_path), max_steps=3))
    _check_resume_config(run, TrainConfig(output=str(tmp_path), max_steps=4))


def test_config_yaml_is_written_atomically_and_a_cut_short_one_is_refused(tmp_path) -> None:
    """A crash mid-write leaves the old config.yaml or the new one, never half; a config.yaml cut short (or
    edited down) is refused at --resume naming the file, not filled with defaults (the default model)."""
    from rllm_train.config import load_config, load_run_config

    path = tmp_path / "config.yaml"
    load_config(None, benchmark="arithmetic", model="tiny-random").dump_yaml(path)
    assert load_run_config(path)["model"] == "tiny-random" and not list(tmp_path.glob(".*tmp"))
    text = path.read_text()
    path.write_text(text[: text.index("model:")])  # cut before the model line
    res = runner.invoke(build_app(), ["train", "--resume", str(tmp_path), "--max-steps", "1"])
    assert res.exit_code == 1 and f"{path} is incomplete (no model" in " ".join(res.output.split())
    assert "Traceback" not in res.output
