"""A trained run is a model: each checkpoint is a directory transformers loads as is, `--model RUN[:step_N]`
serves and evaluates it with the trained weights, a resume works from the new layout and from the old
`trainer.pt` one, older checkpoints keep weights only, and a damaged file is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_backends.local_torch.backend import LocalTorchBackend
from rllm_core.errors import ConfigError, TrainingError
from rllm_serve.models import load_model
from rllm_serve.run_model import checkpoint_info, resolve_checkpoint
from rllm_train.config import load_config
from rllm_train.loop import train

pytestmark = pytest.mark.slow  # a few 2-step tiny-random runs (seconds each)

SMALL = {"model": "tiny-random", "batch_size": 2, "group_size": 2, "max_tokens": 6, "eval_examples": 0,
         "save_every": 1, "lr": 1e-3, "bf16": False, "gradient_checkpointing": False}


def _train(out: Path, steps: int = 2, **extra: Any) -> LocalTorchBackend:
    config = load_config(None, benchmark="arithmetic", output=str(out), max_steps=steps, **{**SMALL, **extra})
    backend = LocalTorchBackend(config)
    train(config, backend=backend, progress=False, console=Console(quiet=True))
    return backend


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    out = tmp_path_factory.mktemp("full") / "run"
    backend = _train(out)
    return out, {k: v.detach().clone() for k, v in backend.trainer.model.state_dict().items()}


def test_a_checkpoint_is_a_model_directory(full_run: tuple[Path, dict[str, torch.Tensor]]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, trained = full_run
    ckpt = run / "checkpoints" / "step_2"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    loaded = model.state_dict()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert "<|im_start|>" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert (ckpt / "generation_config.json").is_file() and (ckpt / "trainer_state.pt").is_file()
    assert not (run / "checkpoints" / "step_1" / "trainer_state.pt").exists()  # older: weights only
    assert (run / "checkpoints" / "step_1" / "model.safetensors").is_file()
    info = checkpoint_info(ckpt)
    assert (info.kind, info.base_model, info.step) == ("full", "tiny-random", 2)


def test_model_takes_a_run_and_serves_the_trained_weights(full_run: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """`--model RUN` (latest), `RUN:step_1`, a checkpoint dir; the server's logprobs equal a fresh forward of
    the trainer's weights."""
    import openai

    from rllm_serve import start_policy_server

    run, trained = full_run
    assert resolve_checkpoint(str(run)) == run / "checkpoints" / "step_2"
    assert resolve_checkpoint(f"{run}:step_1") == run / "checkpoints" / "step_1"
    assert resolve_checkpoint("tiny-random") is None
    loaded = load_model(str(run))
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in trained.items())
    with start_policy_server(str(run)) as server:
        assert server.model_name == str(run)  # served under the name the user gave
        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY")
        r = client.completions.create(model=server.model_name, prompt="1 + 2 =", max_tokens=5, logprobs=1,
                                      extra_body={"return_token_ids": True})
    extra = r.model_extra or {}
    prompt_ids = extra.get("prompt_token_ids") or r.choices[0].model_extra.get("prompt_token_ids")
    ids = r.choices[0].model_extra["token_ids"]
    served = r.choices[0].logprobs.token_logprobs
    model = loaded.model.float().eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0].log_softmax(-1)
    fresh = [float(logits[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(ids)]
    assert max(abs(a - b) for a, b in zip(served, fresh, strict=True)) < 1e-4


def test_eval_takes_a_run(full_run: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    run, _ = full_run
    res = CliRunner().invoke(build_app(), ["eval", "arithmetic", "--model", f"{run}:step_2", "--max-examples",
                                           "2", "--max-tokens", "4", "-o", str(tmp_path / "ev"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["n_episodes"] == 2


def test_lora_and_roles_checkpoints_hold_peft_adapters(tmp_path: Path) -> None:
    backend = _train(tmp_path / "lora", lora_rank=4)
    ckpt = tmp_path / "lora" / "checkpoints" / "step_2"
    assert (ckpt / "adapter_config.json").is_file() and checkpoint_info(ckpt).kind == "lora"
    merged = load_model(str(tmp_path / "lora")).model.state_dict()
    want = backend.trainer.serving_state_dict()
    assert max(float((merged[k] - v).abs().max()) for k, v in want.items()) < 1e-5
    _train(tmp_path / "roles", roles={"solver": "lora:solver"})
    ckpt = tmp_path / "roles" / "checkpoints" / "step_2"
    info = checkpoint_info(ckpt)
    assert info.kind == "roles" and "solver" in info.roles
    peft_model = load_model(str(tmp_path / "roles")).model
    assert set(info.roles) <= set(peft_model.peft_config)


def test_resume_from_the_new_layout_and_the_old_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, steps=2)
    res = CliRunner().invoke(build_app(), ["train", "--resume", str(run), "--max-steps", "3", "--no-progress"])
    assert res.exit_code == 0 and "step    3" in res.output, res.output
    # the layout before model directories: one trainer.pt with the weights and the optimizer
    old = tmp_path / "old"
    backend = _train(old, steps=1)
    ckpt = old / "checkpoints" / "step_1"
    t = backend.trainer
    for f in ckpt.iterdir():
        if f.name != "state.json":
            f.unlink()
    torch.save({"model": t.model.state_dict(), "optimizer": t.optimizer.state_dict(),
                "scheduler": t.scheduler.state_dict(), "step": t.step}, ckpt / "trainer.pt")
    res = CliRunner().invoke(build_app(), ["train", "--resume", str(old), "--max-steps", "2", "--no-progress"])
    assert res.exit_code == 0 and "step    2" in res.output, res.output
    assert (old / "checkpoints" / "step_2" / "model.safetensors").is_file()  # written anew as a model directory


def test_bad_runs_and_damaged_files_are_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, steps=1)
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match="has no complete checkpoint"):
        load_model(str(empty))
    with pytest.raises(ConfigError, match=r"no checkpoint for step 7; its checkpoints are steps 1"):
        load_model(f"{run}:step_7")
    weights = run / "checkpoints" / "step_1" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ConfigError, match=r"cannot be loaded .* cut short or damaged"):
        load_model(str(run))
    res = CliRunner().invoke(build_app(), ["eval", "arithmetic", "--model", str(run), "--max-examples", "1"])
    assert res.exit_code != 0 and "Traceback" not in res.output and "cut short" in " ".join(res.output.split())
    state = run / "checkpoints" / "step_1" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    from rllm_backends.local_torch.checkpoint_io import _torch_load

    with pytest.raises(TrainingError, match=r"trainer_state\.pt is damaged"):
        _torch_load(state)


def test_saved_tokenizers_say_no_cleanup(full_run: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """Every checkpoint's tokenizer says clean_up_tokenization_spaces: false, so no transformers version warns
    about it on each decode (nor strips the space of " ." from byte-level BPE text)."""
    run, _ = full_run
    config = json.loads((run / "checkpoints" / "step_2" / "tokenizer_config.json").read_text())
    assert config["clean_up_tokenization_spaces"] is False
