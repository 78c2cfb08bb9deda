"""A local-backend checkpoint is a model directory: what transformers, vLLM and `rllm serve` load as is.

    checkpoints/step_N/
      config.json, generation_config.json, model.safetensors   full fine-tune (save_pretrained)
      adapter_config.json, adapter_model.safetensors           --lora-rank: the peft adapter, at the top
      adapters/<role>/adapter_config.json, ...safetensors      --roles: one peft adapter per role
      tokenizer.json, tokenizer_config.json, chat_template.jinja   always (the run's tokenizer, chat template)
      local_backend.json                                        base model, kind, roles, dtype, policy version
      trainer_state.pt                                          optimizer, schedule, step, RNG: newest only

Why: a run that ends in a `trainer.pt` (a pickled state dict with the optimizer inside) cannot be evaluated,
served or exported without this code; a model directory can, by anything. The optimizer and RNG state sit
beside the weights, in a file the checkpoint writer drops from older checkpoints (weights only, a third of
the bytes). An older run's `trainer.pt` still resumes (`load_legacy`).
"""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rllm_core.errors import ConfigError, TrainingError

__all__ = ["BACKEND_FILE", "LEGACY_FILE", "TRAINER_STATE", "check_fits", "load_model_dir", "save_model_dir"]

TRAINER_STATE = "trainer_state.pt"
"""Optimizer, schedule, step and RNG state: what a resume needs beyond the weights (only the newest keeps it)."""
LEGACY_FILE = "trainer.pt"
"""The layout before model directories: weights, optimizer and schedule in one pickle."""
BACKEND_FILE = "local_backend.json"


def kind_of(trainer: Any) -> str:
    """"roles" (a peft adapter per role), "lora" (one adapter) or "full"."""
    return "roles" if trainer.adapters else "lora" if trainer.lora else "full"


def save_model_dir(trainer: Any, path: Path, tokenizer: Any, base_model: str | None, policy_version: int) -> None:
    """Write `trainer`'s weights, the tokenizer and the resume state into `path` (see the module docstring)."""
    path = Path(path)
    kind = kind_of(trainer)
    model: Any = trainer.model
    with warnings.catch_warnings():  # peft/transformers warn about things that do not apply to a local save
        warnings.simplefilter("ignore")
        if kind == "full":
            model.save_pretrained(path, safe_serialization=True)
        elif kind == "lora":
            model.save_pretrained(str(path))
        else:
            for name in trainer.adapters:  # a named (non-"default") adapter goes into <dir>/<name>/
                model.save_pretrained(str(path / "adapters"), selected_adapters=[name])
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    torch.save({"optimizer": trainer.optimizer.state_dict(), "scheduler": trainer.scheduler.state_dict(),
                "step": trainer.step, "rng": _rng_state()}, path / TRAINER_STATE)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    (path / BACKEND_FILE).write_text(json.dumps({
        "policy_version": policy_version, "model": base_model, "kind": kind, "roles": list(trainer.adapters),
        "dtype": dtype}), encoding="utf-8")


def load_model_dir(trainer: Any, path: Path) -> None:
    """Restore `trainer` from a checkpoint of either layout; weights only (a fresh optimizer, said in a warning)
    where an older checkpoint kept no trainer_state.pt."""
    path = Path(path)
    if (path / LEGACY_FILE).is_file():
        return load_legacy(trainer, path)
    kind = kind_of(trainer)
    saved = _saved_kind(path)
    if saved is not None and saved != kind:
        raise ConfigError(f"checkpoint {path} holds a {saved} model but this run trains a {kind} one: resume with "
                          "the settings in the run's config.yaml (--lora-rank, --roles)")
    if kind == "full":
        weights = _read_safetensors(path / "model.safetensors")
        _check_names(trainer.model.state_dict(), weights, path)
        trainer.model.load_state_dict(weights, strict=False)  # a tied lm_head is saved once, as the embedding
    else:
        from peft import set_peft_model_state_dict

        names = trainer.adapters or ["default"]
        for name in names:
            folder = path / "adapters" / name if trainer.adapters else path
            weights = _read_safetensors(folder / "adapter_model.safetensors")
            result = set_peft_model_state_dict(trainer.model, weights, adapter_name=name)
            if getattr(result, "unexpected_keys", None):
                raise ConfigError(f"checkpoint {folder} does not fit this model's adapter {name!r}: resume with "
                                  "the --lora-rank / --roles in the run's config.yaml")
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        import logging

        logging.getLogger("rllm.local_torch").warning(
            "checkpoint %s keeps weights only (an older one: the newest keeps the optimizer): resuming with a "
            "fresh optimizer and schedule", path)
        return
    state = _torch_load(state_file)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step = int(state["step"])
    _set_rng_state(state.get("rng"))


def load_legacy(trainer: Any, path: Path) -> None:
    """A `trainer.pt` checkpoint (rllm before model directories): weights, optimizer and schedule together."""
    state = _torch_load(path / LEGACY_FILE)
    check_fits(trainer.model.state_dict(), state["model"], path)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step = int(state["step"])


def _saved_kind(path: Path) -> str | None:
    try:
        return json.loads((path / BACKEND_FILE).read_text(encoding="utf-8")).get("kind")
    except (OSError, json.JSONDecodeError):
        return None


def _check_names(own: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], path: Path) -> None:
    tied = {k: v for k, v in own.items() if k in saved or k != "lm_head.weight"}  # saved once when tied
    check_fits(tied, saved, path)


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of `file`, or one line naming it when it is missing or damaged (never safetensors' own)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise TrainingError(f"checkpoint file {file} is missing; resume from another checkpoint (delete this one) "
                            "or start a new run")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise TrainingError(f"checkpoint file {file} is damaged ({' '.join(str(exc).split())[:120]}): it was cut "
                            "short or edited; delete its checkpoint folder to resume from the one before") from None


def _torch_load(file: Path) -> dict[str, Any]:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)  # tensors and plain values only
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as exc:
        raise TrainingError(f"checkpoint file {file} is damaged ({' '.join(str(exc).split())[:120]}): it was cut "
                            "short or edited; delete its checkpoint folder to resume from the one before") from None


def _rng_state() -> dict[str, Any]:
    """torch's, Python's and numpy's generator states as tensors and plain values (loadable weights_only)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss_next],
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)]}


def _set_rng_state(state: dict[str, Any] | None) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def check_fits(own: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], path: Path) -> None:
    """Refuse, in one line, a checkpoint of another model or LoRA setting (a `--resume` with a changed
    `--model` / `--lora-rank` / `--roles`): torch's own error lists every one of hundreds of mismatched weights."""
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    reshaped = [k for k in own if k in saved and tuple(own[k].shape) != tuple(saved[k].shape)]
    if not (missing or unexpected or reshaped):
        return
    example = (f"{reshaped[0]} is {tuple(saved[reshaped[0]].shape)} there, {tuple(own[reshaped[0]].shape)} here"
               if reshaped else (missing or unexpected)[0])
    raise ConfigError(
        f"checkpoint {path} does not fit this model ({len(missing)} weights missing, {len(unexpected)} "
        f"unexpected, {len(reshaped)} of another shape, e.g. {example}): it was saved with another --model, "
        "--lora-rank or --roles; resume with the settings in the run's config.yaml"
    )
