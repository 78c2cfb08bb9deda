"""Which checkpoints a run directory holds: the reading side of `checkpoints/`, shared by the trainer that
resumes, `--model RUN` and `rllm export`.

A checkpoint directory counts only once it holds `state.json` (the writer puts it last, then renames the
directory into place), and `checkpoints/latest` names the newest; see rllm_train.checkpoints for the writer.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["LATEST", "STATE", "complete_checkpoints", "latest_checkpoint"]

STATE = "state.json"
"""Written last into a checkpoint: a directory without it is a crash's leftover, never read."""
LATEST = "latest"
"""A file naming the newest checkpoint directory (`step_N`)."""


def complete_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Every complete checkpoint, oldest step first."""
    found = [p for p in checkpoints_dir.glob("step_*") if (p / STATE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_", 1)[1]))


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The newest complete checkpoint: the one `latest` names if complete, else the highest complete step."""
    pointer = checkpoints_dir / LATEST
    if pointer.is_file():
        named = checkpoints_dir / pointer.read_text(encoding="utf-8").strip()
        if (named / STATE).is_file():
            return named
    complete = complete_checkpoints(checkpoints_dir) if checkpoints_dir.is_dir() else []
    return complete[-1] if complete else None
