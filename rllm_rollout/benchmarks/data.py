"""Where benchmark files live and how they are read: `--data-dir`, else `RLLM_DATA_DIR`; JSONL per split.

Layout: `<data_dir>/<benchmark>/<split>.jsonl`, one JSON object per line. Reading checks every row for the
fields the loader needs and names the file, line and field when one is missing, instead of failing later
with a KeyError deep in a prompt template. `hub_unreachable` says, in seconds, when the Hugging Face Hub
(the fallback for sets without local files) cannot be used from here.
"""

from __future__ import annotations

import functools
import json
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rllm_core.errors import BenchmarkError

__all__ = ["DATA_DIR_ENV", "count_rows", "hub_unreachable", "read_rows", "resolve_data_dir", "split_file"]

DATA_DIR_ENV = "RLLM_DATA_DIR"


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The data directory to use: the argument, else $RLLM_DATA_DIR, else None."""
    chosen = data_dir or os.environ.get(DATA_DIR_ENV)
    if not chosen:
        return None
    path = Path(chosen).expanduser()
    if not path.is_dir():
        source = "--data-dir" if data_dir else f"${DATA_DIR_ENV}"
        raise BenchmarkError(f"data directory {path} (from {source}) does not exist or is not a directory")
    return path


def split_file(data_dir: Path | None, folder: str, split: str) -> Path | None:
    """`<data_dir>/<folder>/<split>.jsonl` when it exists."""
    if data_dir is None:
        return None
    path = data_dir / folder / f"{split}.jsonl"
    return path if path.is_file() else None


def count_rows(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def read_rows(
    path: Path, required: Iterable[str | tuple[str, ...]], max_rows: int | None = None
) -> list[dict[str, Any]]:
    """Read JSONL rows; each entry of `required` is a field name or a tuple of alternatives (one must exist)."""
    needed = [(r,) if isinstance(r, str) else tuple(r) for r in required]
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchmarkError(f"cannot read benchmark file {path}: {exc}") from exc
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchmarkError(
                f"{path}:{lineno} is not valid JSON ({exc.msg}); each line must be one JSON object"
            ) from exc
        if not isinstance(row, dict):
            raise BenchmarkError(f"{path}:{lineno} is a JSON {type(row).__name__}, expected an object")
        for alts in needed:
            if not any(a in row for a in alts):
                want = repr(alts[0]) if len(alts) == 1 else " or ".join(repr(a) for a in alts)
                raise BenchmarkError(
                    f"{path}:{lineno} has no field {want}; found fields {sorted(row)}. "
                    "Rename the field in the file or use the expected layout (see docs/benchmarks.md)."
                )
        rows.append(row)
        if max_rows is not None and len(rows) >= max_rows:
            break
    return rows


_OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


@functools.cache
def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the Hugging Face Hub cannot be used from here, or None when it can (or when offline mode is on,
    where `datasets` reads its local cache). One quick TCP connect, so a machine without network gets a
    clear error in seconds instead of `datasets` retrying for half a minute."""
    if any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in _OFFLINE_ENV):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"the Hub ({endpoint}) is not reachable from here ({type(exc).__name__}: {exc})"
    return None
