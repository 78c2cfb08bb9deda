"""`rllm export`: a run's checkpoint as a Hugging Face model directory (as trained, merged LoRA, one role's
adapter, another dtype) or a GGUF file that loads back (transformers + gguf, the way the embedded model is
loaded) with the same logits and the same token ids; every bad input is one line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_backends.local_torch.backend import LocalTorchBackend
from rllm_backends.local_torch.export.gguf_writer import write_gguf
from rllm_core.errors import ConfigError
from rllm_train.config import load_config
from rllm_train.export import export_checkpoint
from rllm_train.loop import train

pytestmark = pytest.mark.slow  # 2-step tiny-random runs (seconds each)

SMALL = {"model": "tiny-random", "batch_size": 2, "group_size": 2, "max_tokens": 6, "eval_examples": 0,
         "save_every": 1, "lr": 1e-3, "bf16": False, "gradient_checkpointing": False, "max_steps": 2}
TEXT = "What is 2 + 3? The answer is 5. Héllo wörld <|im_end|>"


def _train(out: Path, **extra: Any) -> LocalTorchBackend:
    config = load_config(None, benchmark="arithmetic", output=str(out), **{**SMALL, **extra})
    backend = LocalTorchBackend(config)
    train(config, backend=backend, progress=False, console=Console(quiet=True))
    return backend


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LocalTorchBackend]:
    run = tmp_path_factory.mktemp("full") / "run"
    return run, _train(run)


def _logits(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(torch.tensor([ids])).logits[0].float()


def test_hf_export_reloads_equal(full: tuple[Path, LocalTorchBackend], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, backend = full
    res = CliRunner().invoke(build_app(), ["export", str(run), "-o", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for name, value in backend.trainer.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").chat_template
    half = export_checkpoint(f"{run}:step_1", tmp_path / "f16", dtype="float16")
    assert half.checkpoint.name == "step_1"
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "f16").dtype == torch.float16


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gguf_round_trip(full: tuple[Path, LocalTorchBackend], tmp_path: Path, dtype: str) -> None:
    """Loaded back as the embedded model is (transformers + gguf): f32 logits within 1e-4 (the same numbers),
    f16 within f16's rounding of the weights; the tokenizer read from the GGUF gives the same ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, backend = full
    result = export_checkpoint(str(run), tmp_path, fmt="gguf", dtype=dtype, force=True)
    (path,) = result.files
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ids = backend.tokenizer.encode(TEXT)
    assert tok.encode(TEXT) == ids
    reference = copy.deepcopy(backend.trainer.model)
    if dtype == "float16":  # the file holds the matrices rounded to f16 (norms stay f32): compare with exactly that
        with torch.no_grad():
            for p in reference.parameters():
                if p.ndim == 2:
                    p.copy_(p.half().float())
    error = float((_logits(reference, ids) - _logits(back, ids)).abs().max())
    assert error <= 1e-4, error
    assert tok.chat_template == backend.tokenizer.chat_template


def test_lora_merge_and_role_adapters(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    backend = _train(tmp_path / "lora", lora_rank=4)
    export_checkpoint(str(tmp_path / "lora"), tmp_path / "merged", merge_lora=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    want = backend.trainer.serving_state_dict()
    assert max(float((merged[k] - v).abs().max()) for k, v in want.items()) < 1e-5
    adapter = export_checkpoint(str(tmp_path / "lora"), tmp_path / "adapter")
    assert {p.name for p in adapter.files} >= {"adapter_config.json", "adapter_model.safetensors"}
    _train(tmp_path / "roles", roles={"solver": "lora:solver"})
    every = export_checkpoint(str(tmp_path / "roles"), tmp_path / "all")
    assert (tmp_path / "all" / "adapters" / "solver" / "adapter_model.safetensors") in every.files
    export_checkpoint(str(tmp_path / "roles"), tmp_path / "solver", role="solver", merge_lora=True)
    assert (tmp_path / "solver" / "model.safetensors").is_file()
    with pytest.raises(ConfigError, match="pick one with --role"):
        export_checkpoint(str(tmp_path / "roles"), tmp_path / "x", merge_lora=True)


def test_bad_input_is_one_line(full: tuple[Path, LocalTorchBackend], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = full
    cases = [
        ([str(tmp_path), "-o", str(tmp_path / "a")], "is not a run or checkpoint"),
        ([str(run), "--step", "9", "-o", str(tmp_path / "b")], "no checkpoint for step 9; its checkpoints are"),
        ([str(run), "--merge-lora", "-o", str(tmp_path / "c")], "is a full fine-tune"),
        ([str(run), "--format", "onnx", "-o", str(tmp_path / "d")], "use hf or gguf"),
        ([str(run), "-o", str(Path(__file__).parent)], "exists and is not empty"),
    ]
    for args, message in cases:
        res = CliRunner().invoke(build_app(), ["export", *args])
        assert res.exit_code == 1 and message in " ".join(res.output.split()), res.output
        assert "Traceback" not in res.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = CliRunner().invoke(build_app(), ["export", str(run), "-o", str(tmp_path / "e"), "--push-to-hub", "me/m"])
    assert res.exit_code == 1 and "HF_HUB_OFFLINE is set" in " ".join(res.output.split())
    assert not (tmp_path / "e").exists()  # refused before anything was written


def test_gguf_refuses_another_architecture(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from rllm_serve.models import load_tokenizer

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=64))
    with pytest.raises(ConfigError, match=r"GGUF export supports LlamaForCausalLM .* this model is GPT2LMHeadModel"):
        write_gguf(model, load_tokenizer("tiny-random"), tmp_path / "m.gguf")


def test_a_damaged_checkpoint_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, max_steps=1)
    weights = run / "checkpoints" / "step_1" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    res = CliRunner().invoke(build_app(), ["export", str(run), "-o", str(tmp_path / "out")])
    assert res.exit_code == 1 and "cut short or damaged" in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


def _tinker_run(root: Path, run: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Tinker run's checkpoint as `TinkerBackend.save` lays it out, its state saved on the SDK double."""
    import json

    from rllm_backends.tinker.double_export import ExportServiceDouble
    from rllm_backends.tinker.double_training import TrainingClientDouble

    service = ExportServiceDouble(root)
    training = service.create_lora_training_client("tiny-random", rank=4).result()
    with torch.no_grad():  # weights the base does not have, so a download of the base would fail the test
        next(iter(training.policy.model.parameters())).add_(0.5)
    state = training.save_state("s1").result().path
    sampler = training.save_weights_for_sampler("p1").result().path
    ckpt = run / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    (ckpt / "tinker_backend.json").write_text(json.dumps({
        "state_path": state, "sampler_path": sampler, "base_model": "tiny-random", "lora_rank": 4,
        "policy_version": 1, "steps_done": 1, "tinker_version": "0.38.0"}))
    (ckpt / "state.json").write_text(json.dumps({"step": 1}))
    (run / "checkpoints" / "latest").write_text("step_1")
    folder = root / state.removeprefix("tinker://")
    return ckpt, TrainingClientDouble.read_weights(folder)


def test_tinker_download_through_the_sdk_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK 0.38 download (state → temporary external weights → signed URLs → files → delete) against the
    double: the files hold exactly the trained weights, the temporary copy is gone, the note names the base."""
    import json

    from safetensors.torch import load_file

    from rllm_backends.tinker import retry
    from rllm_backends.tinker.export import download_tinker_checkpoint, is_tinker_checkpoint

    root = tmp_path / "service"
    ckpt, want = _tinker_run(root, tmp_path / "run")
    monkeypatch.setenv("RLLM_TINKER_SERVICE", "rllm_backends.tinker.double_export:service_export_double_from_env")
    monkeypatch.setenv("RLLM_TINKER_DOUBLE_DIR", str(root))
    monkeypatch.setattr(retry, "RETRY_WAIT_S", 0.01)
    assert is_tinker_checkpoint(ckpt)
    out = tmp_path / "out"
    out.mkdir()
    files = download_tinker_checkpoint(ckpt, out)
    assert {p.name for p in files} == {"model.safetensors", "meta.json", "rllm_export.json"}
    got = load_file(str(out / "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert json.loads((out / "rllm_export.json").read_text())["base_model"] == "tiny-random"
    assert not list(root.glob("*/external_weights/*"))  # the temporary external copy was deleted
    # the same through the command a user runs; flags that need the weights here are refused in one line
    res = CliRunner().invoke(build_app(), ["export", str(tmp_path / "run"), "-o", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert "Tinker LoRA adapter" in " ".join(res.output.split())
    cli = load_file(str(tmp_path / "cli" / "model.safetensors"))
    assert all(torch.equal(cli[k], want[k]) for k in want)
    res = CliRunner().invoke(build_app(), ["export", str(tmp_path / "run"), "-o", str(tmp_path / "g"),
                                           "--format", "gguf"])
    assert res.exit_code == 1 and "Tinker checkpoint" in res.output and "Traceback" not in res.output
    # a service that fails transiently is retried; one that refuses (a missing state) is one line
    (ckpt / "tinker_backend.json").write_text(json.dumps({"state_path": "tinker://nope/weights/x",
                                                          "base_model": "tiny-random"}))
    with pytest.raises(Exception, match="create_training_client_from_state") as info:
        download_tinker_checkpoint(ckpt, tmp_path / "out2")
    assert "\n" not in str(info.value)
    monkeypatch.delenv("RLLM_TINKER_SERVICE")  # the real SDK without a key: one line naming the variable
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="export TINKER_API_KEY"):
        download_tinker_checkpoint(ckpt, tmp_path / "out3")


def test_tinker_double_download_signatures_match_the_sdk() -> None:
    import inspect

    import tinker

    from rllm_backends.tinker.double_export import ExportRestClientDouble, ExportTrainingClientDouble

    pairs = [(ExportTrainingClientDouble.save_weights_external, tinker.TrainingClient.save_weights_external)]
    pairs += [(getattr(ExportRestClientDouble, m), getattr(tinker.RestClient, m)) for m in
              ("get_external_weights_urls", "set_checkpoint_ttl_from_tinker_path",
               "delete_checkpoint_from_tinker_path")]
    for ours, sdk in pairs:
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(sdk).parameters), sdk.__name__
