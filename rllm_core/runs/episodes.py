"""Episodes files and their index sidecar: written together, read page by page.

An episodes file holds one Episode per line; beside it `<name>.jsonl.idx` holds one small line per episode with
the byte offset and length of its line and the figures a list needs (task, reward, reason, tokens, a preview).
A monitor pages a 10,000-episode file from the sidecar alone and loads one episode with a seek: it never reads
or parses the whole file. The sidecar is a cache: `EpisodeIndex` rebuilds what it lacks (missing, shorter than
the file, from another version) by scanning the episodes file from where the sidecar stops, so a file written
by anything else is still readable.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rllm_core.runs.layout import INDEX_SUFFIX
from rllm_core.runs.media import externalize_media, media_dir_for

__all__ = ["EpisodeIndex", "EpisodeWriter", "episode_summary", "index_path", "write_episodes"]

PREVIEW_CHARS = 200


def index_path(path: str | Path) -> Path:
    """`episodes/step_3.jsonl` → `episodes/step_3.jsonl.idx` (eval: `episodes.jsonl` → `episodes.jsonl.idx`)."""
    path = Path(path)
    return path.with_name(path.name + INDEX_SUFFIX)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None  # NaN is no JSON a browser reads


def _preview(text: Any) -> str:
    if not isinstance(text, str):
        text = "" if text is None else json.dumps(text, default=str)
    return " ".join(text[: PREVIEW_CHARS * 4].split())[:PREVIEW_CHARS]


def episode_summary(ep: dict[str, Any]) -> dict[str, Any]:
    """The sidecar line of one episode (as its JSON dict; pydantic-free, so the reader's fallback scan and the
    writer produce the same thing). `reason` is the reward reason ("unscored" when none was given, as in an eval
    summary); `error` the first 200 characters of the episode's error or null; `has_token_ids` whether any step
    carries completion token ids (false: nothing of it can be trained on)."""
    task = ep.get("task") or {}
    steps = [s for t in ep.get("trajectories") or [] for s in t.get("steps") or []]
    tokens = 0
    for s in steps:
        ids = s.get("completion_token_ids")
        tokens += len(ids) if ids is not None else int((s.get("usage") or {}).get("completion_tokens") or 0)
    last = max(steps, key=lambda s: s.get("started_at") or 0.0) if steps else None
    artifacts = ep.get("artifacts") or {}
    preview = last.get("text") if last is not None and last.get("text") else artifacts.get("answer", artifacts)
    error = ep.get("error")
    return {
        "task_id": task.get("id"), "id": ep.get("id"), "attempt": ep.get("attempt", 0),
        "reward": _finite(ep.get("reward")), "reason": ep.get("reward_reason") or "unscored",
        "is_correct": ep.get("is_correct"), "termination": ep.get("termination_reason"),
        "n_trajectories": len(ep.get("trajectories") or []), "n_steps": len(steps), "response_tokens": tokens,
        "has_token_ids": any(s.get("completion_token_ids") for s in steps),
        "error": str(error)[:PREVIEW_CHARS] if error else None, "preview": _preview(preview or ""),
    }


def _line(ep: Any, media_dir: Path) -> bytes:
    if isinstance(ep, bytes):
        text = ep.decode("utf-8").rstrip("\n")
    elif isinstance(ep, str):
        text = ep.rstrip("\n")
    elif isinstance(ep, dict):
        text = json.dumps(ep)
    else:
        text = ep.model_dump_json()  # an rllm Episode (not imported: this module stays pydantic-free)
    return externalize_media(text, media_dir).encode("utf-8") + b"\n"  # images: once, under <run>/media


class EpisodeWriter:
    """Writes an episodes file and its sidecar, one episode at a time, each flushed as it lands: a monitor sees
    every finished episode. The episode line is written before its index line, so the sidecar never points past
    the data. `with EpisodeWriter(path) as w: w.write(episode)`; thread-safe."""

    def __init__(self, path: str | Path, media_dir: str | Path | None = None) -> None:
        self.path = Path(path)
        self.media_dir = Path(media_dir) if media_dir is not None else media_dir_for(self.path)
        self.index_path = index_path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._data = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._index = open(self.index_path, "wb")  # noqa: SIM115
        self._offset = 0
        self.count = 0
        self._lock = threading.Lock()

    def write(self, episode: Any) -> dict[str, Any]:
        """Append one Episode (or its JSON text / dict); returns its sidecar line."""
        line = _line(episode, self.media_dir)
        with self._lock:
            self._data.write(line)
            self._data.flush()
            entry = {"index": self.count, "offset": self._offset, "length": len(line),
                     **episode_summary(json.loads(line))}
            self._index.write(json.dumps(entry).encode("utf-8") + b"\n")
            self._index.flush()
            self._offset += len(line)
            self.count += 1
        return entry

    def close(self) -> None:
        self._data.close()
        self._index.close()

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_episodes(path: str | Path, episodes: Iterable[Any]) -> int:
    """Write a whole episodes file and its sidecar; returns how many episodes."""
    with EpisodeWriter(path) as w:
        for ep in episodes:
            w.write(ep)
        return w.count


class EpisodeIndex:
    """The summaries of one episodes file, kept up to date incrementally: each `refresh` reads only the bytes
    appended to the sidecar and to the episodes file since the last one (a file rewritten from the start, as on
    `--resume`, is noticed by its inode or its shrinking and read again). `partial_lines` counts a half-written
    last line (skipped until it is complete) and lines that are not JSON."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index_path = index_path(path)
        self._reset(None)

    def _reset(self, ident: tuple[int, int] | None) -> None:
        self.items: list[dict[str, Any]] = []
        self.covered = 0  # bytes of the episodes file that `items` describes
        self._index_pos = 0
        self._ident = ident
        self._use_sidecar = True
        self.partial_lines = 0
        self._bad = 0
        self._size = self._isize = -2

    def refresh(self) -> list[dict[str, Any]]:
        st = os.stat(self.path)
        try:
            ist = os.stat(self.index_path)
            ident, isize = (st.st_ino, ist.st_ino), ist.st_size
        except FileNotFoundError:
            ident, isize = (st.st_ino, -1), -1
        old = self._ident
        replaced = old is not None and (ident[0] != old[0] or -1 != old[1] != ident[1])
        if replaced or st.st_size < self.covered or 0 <= isize < self._index_pos:
            self._reset(ident)  # rewritten from the start (a resumed step): read it again
        self._ident = ident
        if (st.st_size, isize) == (self._size, self._isize):
            return self.items  # nothing new: a poll costs two stats
        self._size, self._isize = st.st_size, isize
        if isize >= 0 and self._use_sidecar:
            self._read_sidecar(st.st_size)
        self._scan(st.st_size)
        return self.items

    def _read_sidecar(self, size: int) -> None:
        with open(self.index_path, "rb") as f:
            f.seek(self._index_pos)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        if not end:
            return
        try:  # one parse for the whole chunk: 10,000 lines in a few tens of ms
            entries = json.loads(b"[" + chunk[: end - 1].replace(b"\n", b",") + b"]")
            taken = [(int(e["offset"]), int(e["length"]), e) for e in entries]
        except (ValueError, KeyError, TypeError):
            self._use_sidecar = False  # not ours, or damaged: the scan rebuilds from the data file
            return
        used = len(taken)
        for k, (offset, length, entry) in enumerate(taken):
            if offset + length > size:
                used = k  # written after we looked at the data file's size: the next refresh takes it
                break
            if offset > self.covered:
                self._use_sidecar = False  # a gap: the sidecar is not this file's
                return
            if offset == self.covered:  # (offset < covered: scanned from the data before the sidecar caught up)
                entry["index"] = len(self.items)
                self.items.append(entry)
                self.covered = offset + length
        if used == len(taken):
            self._index_pos += end
        else:
            pos = 0
            for _ in range(used):
                pos = chunk.index(b"\n", pos) + 1
            self._index_pos += pos

    def _scan(self, size: int) -> None:
        if self.covered >= size:
            self.partial_lines = self._bad
            return
        with open(self.path, "rb") as f:
            f.seek(self.covered)
            chunk = f.read(size - self.covered)
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                break
            raw = chunk[pos:nl + 1]
            offset = self.covered + pos
            pos = nl + 1
            if not raw.strip():
                continue
            try:
                ep = json.loads(raw)
            except ValueError:
                self._bad += 1
                continue
            self.items.append({"index": len(self.items), "offset": offset, "length": len(raw),
                               **episode_summary(ep)})
        self.covered += pos
        self.partial_lines = self._bad + (1 if chunk[pos:].strip() else 0)

    def load(self, index: int) -> dict[str, Any]:
        """Episode `index` as its JSON dict, read with one seek."""
        items = self.refresh()
        if not 0 <= index < len(items):
            raise IndexError(f"{self.path} has {len(items)} episodes; index {index} is out of range")
        entry = items[index]
        with open(self.path, "rb") as f:
            f.seek(entry["offset"])
            raw = f.read(entry["length"])
        return json.loads(raw)
