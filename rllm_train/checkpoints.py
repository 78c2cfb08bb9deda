"""Atomic checkpoints: a crash (even SIGKILL) mid-write never leaves a broken latest checkpoint.

A checkpoint is written into `checkpoints/.tmp-step_N-<pid>/` (backend state first, `state.json` last, each
fsynced), then renamed to `checkpoints/step_N/` (one atomic rename on POSIX), then `checkpoints/latest` is
replaced atomically (write a temp file, `os.replace`). A reader trusts only directories that hold
`state.json`; leftover `.tmp-*` directories are removed when the next run starts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from rllm_core.errors import TrainingError
from rllm_core.runs.checkpoints import LATEST, STATE, complete_checkpoints, latest_checkpoint
from rllm_train.backend import Backend

__all__ = ["clean_partial_checkpoints", "latest_checkpoint", "read_state", "save_checkpoint"]



def _fsync_tree(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(checkpoints_dir: Path, step: int, backend: Backend, state: dict[str, Any], keep: int = 2) -> Path:
    """Write backend state + `state` (loop state: step, policy version, ...) as checkpoint `step_<step>`."""
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoints_dir / f"step_{step}"
    tmp = checkpoints_dir / f".tmp-step_{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    backend.save(tmp)
    (tmp / STATE).write_text(json.dumps({**state, "step": step}), encoding="utf-8")
    _fsync_tree(tmp)
    if final.exists():  # the same step written again after a resume: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer = checkpoints_dir / f".{LATEST}.tmp"
    pointer.write_text(final.name, encoding="utf-8")
    os.replace(pointer, checkpoints_dir / LATEST)
    _prune(checkpoints_dir, keep, final)
    return final


RESUME_ONLY_FILES = ("trainer_state.pt",)
"""Files only a resume from the newest checkpoint needs (the optimizer, twice the weights' bytes): older kept
checkpoints drop them and keep their weights, still loadable, evaluable and exportable."""


def _prune(checkpoints_dir: Path, keep: int, newest: Path) -> None:
    complete = complete_checkpoints(checkpoints_dir)
    for old in complete:
        if old != newest:
            for name in RESUME_ONLY_FILES:
                (old / name).unlink(missing_ok=True)
    if keep <= 0:
        return
    for old in complete[:-keep]:
        if old != newest:
            shutil.rmtree(old, ignore_errors=True)


def clean_partial_checkpoints(checkpoints_dir: Path) -> int:
    """Remove `.tmp-*` directories left by a crash mid-write; returns how many."""
    n = 0
    for tmp in checkpoints_dir.glob(".tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)
        n += 1
    return n


def read_state(checkpoint: Path) -> dict[str, Any]:
    try:
        return json.loads((checkpoint / STATE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TrainingError(f"checkpoint {checkpoint} is unreadable ({exc}); delete it to resume from an older one")\
            from None
