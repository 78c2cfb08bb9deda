"""`--model` takes a run: a run directory, `RUN:step_N`, or one checkpoint directory, named and described here.

`rllm eval --model runs/arith-01`, `rllm serve --model runs/arith-01:step_40` and `rllm export` resolve the
checkpoint here; models.py loads it with the run's own settings: the saved tokenizer and chat template, the base model
a LoRA checkpoint was trained on (named in its `local_backend.json`), every role's adapter for a `--roles` run.
Anything that is not a run (a built-in name, a Hugging Face id, a plain model directory) is left to the caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rllm_core.errors import ConfigError

__all__ = ["CheckpointInfo", "checkpoint_info", "list_steps", "resolve_checkpoint"]

CheckpointKind = Literal["full", "lora", "roles", "legacy"]
_STEP = re.compile(r"^(?P<run>.+?):(?:step_)?(?P<step>\d+)$")


@dataclass
class CheckpointInfo:
    path: Path
    base_model: str | None
    kind: CheckpointKind
    roles: list[str] = field(default_factory=list)
    dtype: str = "float32"
    step: int | None = None


def _is_checkpoint(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "local_backend.json").is_file())


def list_steps(run: Path) -> list[int]:
    """The complete checkpoints of a run, by step."""
    folder = run / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(p.name.split("_", 1)[1]) for p in folder.glob("step_*")
                  if p.name.split("_", 1)[1].isdigit() and (p / "state.json").is_file())


def resolve_checkpoint(spec: str, step: int | None = None) -> Path | None:
    """The checkpoint directory `spec` names (`RUN`, `RUN:step_N`, `RUN:N`, a checkpoint directory), the
    newest complete one of a run unless a step is given; None when `spec` is no run at all (a model name, an
    id, a plain model directory). A run without checkpoints or a missing step is one ConfigError line."""
    if (m := _STEP.match(spec)) and not Path(spec).exists():
        spec, step = m.group("run"), int(m.group("step"))
    path = Path(spec).expanduser()
    if _is_checkpoint(path) and step is None:
        return path
    is_run = (path / "checkpoints").is_dir() or ((path / "config.yaml").is_file() and (path / "metrics.jsonl").exists())
    if not is_run:
        if step is not None:
            raise ConfigError(f"{path} is not a run directory (no checkpoints/ there): a step can only be picked "
                              "from a run that rllm train wrote")
        return None
    steps = list_steps(path)
    if not steps:
        raise ConfigError(f"{path} has no complete checkpoint in {path / 'checkpoints'} (a run stopped before its "
                          "first save, or not written by rllm train); train on, or give a model or checkpoint")
    if step is None:
        from rllm_core.runs.checkpoints import latest_checkpoint

        latest = latest_checkpoint(path / "checkpoints")
        return latest if latest is not None else path / "checkpoints" / f"step_{steps[-1]}"
    if step not in steps:
        raise ConfigError(f"{path} has no checkpoint for step {step}; its checkpoints are steps "
                          f"{', '.join(map(str, steps))}")
    return path / "checkpoints" / f"step_{step}"


def checkpoint_info(ckpt: Path) -> CheckpointInfo:
    """What a checkpoint holds, from its `local_backend.json` (and its files, for the older `trainer.pt` one)."""
    meta: dict[str, Any] = {}
    try:
        meta = json.loads((ckpt / "local_backend.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        pass
    step = None
    try:
        step = int(json.loads((ckpt / "state.json").read_text(encoding="utf-8"))["step"])
    except (OSError, json.JSONDecodeError, KeyError, ValueError):
        pass
    if (ckpt / "trainer.pt").is_file():
        kind: CheckpointKind = "legacy"
    elif (ckpt / "adapters").is_dir():
        kind = "roles"
    elif (ckpt / "adapter_config.json").is_file():
        kind = "lora"
    elif (ckpt / "config.json").is_file():
        kind = "full"
    else:
        raise ConfigError(f"{ckpt} holds no model (no config.json, adapter_config.json, adapters/ or trainer.pt): "
                          "is it a checkpoint of the local backend? (verl and tinker runs: `rllm export`)")
    roles = list(meta.get("roles") or ([p.name for p in sorted((ckpt / "adapters").iterdir()) if p.is_dir()]
                                       if kind == "roles" else []))
    return CheckpointInfo(path=ckpt, base_model=meta.get("model"), kind=kind, roles=roles,
                          dtype=str(meta.get("dtype") or "float32"), step=step)
