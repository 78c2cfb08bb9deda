"""File names of a run directory and what an episodes file's name says (kind, step): shared by writers and reader
so the two never disagree."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "STALE_AFTER_S", "file_kind", "write_json_atomic"]

FORMAT = 1
"""run.json's "format": bumped when a reader of the old layout would misread the new one."""

STALE_AFTER_S = 30.0
"""A "running" heartbeat older than this means the writer died (it beats every HEARTBEAT_S)."""

HEARTBEAT_S = 5.0

RUN_JSON = "run.json"
CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
HEARTBEAT = "heartbeat.json"
LOG = "log.txt"
EPISODES_DIR = "episodes"
CHECKPOINTS_DIR = "checkpoints"
SUMMARY = "summary.json"
EVAL_EPISODES = "episodes.jsonl"
"""Eval's episodes file, at the top of the run (where `rllm eval` always wrote it); the reader names it "eval"."""
EVAL_FILE_NAME = "eval"
INDEX_SUFFIX = ".idx"
"""Sidecar = episodes file name + this: `step_3.jsonl.idx`, so `episodes/*.jsonl` still globs only episodes."""

_NAME = re.compile(r"^(?P<kind>step|eval_step|eval_greedy_step)_(?P<step>\d+)$")
_KINDS = {"step": "train", "eval_step": "eval", "eval_greedy_step": "eval_greedy"}


def file_kind(name: str) -> tuple[str, int | None]:
    """("train"|"eval"|"eval_greedy", step) of an episodes file name; ("eval", None) for eval's own file, and
    ("other", None) for a name no rllm writer uses (a user's file is still listed, never refused)."""
    if name == EVAL_FILE_NAME:
        return "eval", None
    m = _NAME.match(name)
    if m is None:
        return "other", None
    return _KINDS[m["kind"]], int(m["step"])


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file and rename it over `path`: a reader sees the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
    os.replace(tmp, path)
