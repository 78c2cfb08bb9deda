"""Reading a run directory while its run writes it (the monitor's side; torch-free and pydantic-free).

    reader = RunReader("runs/x")          # or open_run(path): one cached reader per directory
    reader.info().as_dict()               # kind, status, benchmark, model, step, reward, ... (see RunInfo)
    records, next_k, partial = reader.metrics(since=k)   # only the bytes appended since the last call are read
    reader.files()                        # [{"name": "step_3", "kind": "train", "step": 3, "episodes": 8}, ...]
    reader.summaries("step_3")            # the sidecar lines; reader.episode("step_3", 5) seeks to one episode

A reader caches what it has parsed (metrics records, episode indexes, the config) and re-reads only what grew,
so a monitor keeps one per run (`open_run`) and polls it cheaply. Files are read as they are: a half-written
last line is skipped and counted (`partial_lines`), never an error.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.runs.episodes import EpisodeIndex
from rllm_core.runs.layout import (
    CHECKPOINTS_DIR,
    CONFIG,
    EPISODES_DIR,
    EVAL_EPISODES,
    EVAL_FILE_NAME,
    HEARTBEAT,
    LOG,
    METRICS,
    RUN_JSON,
    STALE_AFTER_S,
    SUMMARY,
    file_kind,
)

__all__ = ["NotARunError", "RunInfo", "RunReadError", "RunReader", "find_runs", "open_run"]

WHAT_A_RUN_IS = (f"a run directory holds {RUN_JSON} (or, from older rllm versions, {METRICS} / {CONFIG} with "
                 f"{EPISODES_DIR}/ or {CHECKPOINTS_DIR}/ for training, {SUMMARY} / {EVAL_EPISODES} for eval); "
                 "`rllm train --output DIR` and `rllm eval --output DIR` write one")
_SKIP_DIRS = {CHECKPOINTS_DIR, EPISODES_DIR, "__pycache__", "node_modules", "site-packages"}


class RunReadError(ConfigError):
    """What was asked of a run is not there: no such episodes file, an episode index out of range."""


class NotARunError(RunReadError):
    """The path is not a run directory (the message says what one looks like)."""


@dataclass
class RunInfo:
    """One run at a glance (the monitor's run list). Missing figures are None."""

    path: str
    kind: str
    status: str
    benchmark: str | None = None
    model: str | None = None
    backend: str | None = None
    step: int | None = None
    max_steps: int | None = None
    reward: float | None = None
    accuracy: float | None = None
    val_accuracy: float | None = None
    started: float | None = None
    updated: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing, or caught between two writes of a non-atomic writer
    return data if isinstance(data, dict) else None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone else's process: alive as far as we can tell
    return True


def _is_run_dir(path: Path, names: set[str] | None = None) -> bool:
    if names is None:
        try:
            names = set(os.listdir(path))
        except OSError:
            return False
    if names & {RUN_JSON, METRICS, SUMMARY, EVAL_EPISODES}:
        return True
    return CONFIG in names and bool(names & {EPISODES_DIR, CHECKPOINTS_DIR})


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory at or below `root` (train and eval), sorted; a run's own subdirectories and hidden
    directories are not searched."""
    root = Path(root)
    if not root.is_dir():
        raise NotARunError(f"{root} is not a directory; give the directory that holds your runs")
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        if _is_run_dir(Path(dirpath), set(filenames) | set(dirnames)):
            found.append(Path(dirpath))
            dirnames.clear()
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
    return sorted(found)


class RunReader:
    """Reads one run directory; every method re-reads only what changed since the last call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._metrics: list[dict[str, Any]] = []
        self._metrics_pos = 0
        self._metrics_ino = -1
        self._metrics_bad = 0
        self._metrics_partial = 0
        self._indexes: dict[str, EpisodeIndex] = {}
        self._config: tuple[float | None, dict[str, Any], str] | None = None

    # -- files inside the run only -------------------------------------------------------------------------
    def _inside(self, path: Path) -> bool:
        """True when `path` resolves inside the run directory: a `log.txt` or `config.yaml` linked to a file
        elsewhere (another user's secrets, /etc/shadow) must not be served by `rllm view` as the run's."""
        try:
            return path.resolve().is_relative_to(self.path.resolve())
        except (OSError, RuntimeError):  # a link loop
            return False

    def _in_run(self, *parts: str) -> Path:
        """`self.path / parts` when that resolves inside the run, else a path that does not exist (so every
        reader treats a link out of the run like a missing file)."""
        path = self.path.joinpath(*parts)
        return path if self._inside(path) else self.path / ".outside-the-run" / parts[-1]

    # -- what the run is ------------------------------------------------------------------------------------
    def is_run(self) -> bool:
        return self.path.is_dir() and _is_run_dir(self.path)

    def require(self) -> RunReader:
        if not self.path.exists():
            raise NotARunError(f"{self.path} does not exist; {WHAT_A_RUN_IS}")
        if not self.is_run():
            raise NotARunError(f"{self.path} is not an rllm run: {WHAT_A_RUN_IS}")
        return self

    def run_json(self) -> dict[str, Any]:
        return _json_file(self._in_run(RUN_JSON)) or {}

    def heartbeat(self) -> dict[str, Any] | None:
        return _json_file(self._in_run(HEARTBEAT))

    def kind(self) -> str:
        kind = self.run_json().get("kind")
        if kind in ("train", "eval"):
            return str(kind)
        return "eval" if (self._in_run(SUMMARY)).exists() or (self._in_run(EVAL_EPISODES)).exists() else "train"

    def status(self, now: float | None = None) -> tuple[str, str | None]:
        """(status, error): see the package docstring for the rules."""
        now = time.time() if now is None else now
        beat = self.heartbeat()
        if beat is not None and beat.get("status") in ("finished", "failed"):
            return str(beat["status"]), beat.get("error")
        if beat is not None:
            if now - float(beat.get("time") or 0) > STALE_AFTER_S:
                return "crashed", "the run stopped writing its heartbeat (killed, or its machine went down)"
            run = self.run_json()
            pid = beat.get("pid") or run.get("pid")
            if run.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
                return "crashed", f"the run's process {pid} is gone"
            return "running", None
        errors = [r for r in self.metrics()[0] if r.get("kind") == "error"]
        if errors:
            return "failed", errors[-1].get("error")
        changed = [m for m in (_mtime(self._in_run(METRICS)), _mtime(self._in_run(EVAL_EPISODES))) if m is not None]
        if changed and now - max(changed) < STALE_AFTER_S:
            return "running", None
        done = (self._in_run(SUMMARY)).exists() if self.kind() == "eval" else bool(self._metrics)
        return ("finished", None) if done else ("crashed", None)

    def info(self) -> RunInfo:
        self.require()
        kind = self.kind()
        status, error = self.status()
        cfg = self.config()["config"]
        records = self.metrics()[0]
        beat = self.heartbeat() or {}
        info = RunInfo(path=str(self.path), kind=kind, status=status, error=error,
                       benchmark=cfg.get("benchmark"), model=cfg.get("served_model") or cfg.get("model"),
                       backend=cfg.get("backend"), started=self.run_json().get("started"))
        train = [r for r in records if r.get("kind") == "train"]
        evals = [r for r in records if r.get("kind") == "eval"]
        if kind == "train":
            info.max_steps = cfg.get("max_steps")
            info.step = train[-1].get("step") if train else beat.get("step")
            if train:
                info.reward, info.accuracy = train[-1].get("reward/mean"), train[-1].get("reward/accuracy")
            if evals:
                info.val_accuracy = evals[-1].get("val/reward/accuracy")
        else:
            info.step, info.max_steps = beat.get("step"), beat.get("max_steps")
            if evals:
                info.reward, info.accuracy = evals[-1].get("reward/mean"), evals[-1].get("reward/accuracy")
                info.step = info.step if info.step is not None else evals[-1].get("episode/count")
            elif self._episodes_path(EVAL_FILE_NAME).exists():
                items = self.summaries(EVAL_FILE_NAME)
                if items:
                    info.reward = sum(i.get("reward") or 0.0 for i in items) / len(items)
                    info.accuracy = sum(1 for i in items if i.get("is_correct")) / len(items)
                    info.step = len(items) if info.step is None else info.step
            summary = _json_file(self._in_run(SUMMARY)) or {}
            info.benchmark = info.benchmark or summary.get("benchmark")
            info.model = info.model or summary.get("model")
        times = [t for t in (beat.get("time"), _mtime(self._in_run(METRICS)), _mtime(self._in_run(SUMMARY)))
                 if isinstance(t, int | float)]
        info.updated = max(times) if times else None
        if info.started is None:
            info.started = _mtime(self._in_run(CONFIG)) or _mtime(self.path)
        return info

    # -- files that grow ------------------------------------------------------------------------------------
    def metrics(self, since: int = 0) -> tuple[list[dict[str, Any]], int, int]:
        """(records since..., next, partial_lines). `next` is the number of complete records: pass it as
        `since` to get only what came after. A file rewritten from the start (`--resume` drops metrics after its
        checkpoint) is read again, so `next` can go down: a client seeing next < since reloads."""
        path = self._in_run(METRICS)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return [], 0, 0
        if st.st_ino != self._metrics_ino or st.st_size < self._metrics_pos:
            self._metrics, self._metrics_pos, self._metrics_bad = [], 0, 0
            self._metrics_ino = st.st_ino
        if st.st_size > self._metrics_pos:
            with open(path, "rb") as f:
                f.seek(self._metrics_pos)
                chunk = f.read(st.st_size - self._metrics_pos)
            end = chunk.rfind(b"\n") + 1
            for raw in chunk[:end].splitlines():
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except ValueError:
                    self._metrics_bad += 1  # a line cut by a crash mid-write, then appended after
                    continue
                if isinstance(record, dict):
                    self._metrics.append(record)
            self._metrics_pos += end
            self._metrics_partial = 1 if chunk[end:].strip() else 0
        since = max(0, since)
        return self._metrics[since:], len(self._metrics), self._metrics_bad + self._metrics_partial

    def config(self) -> dict[str, Any]:
        """{"config": the parsed config.yaml (eval runs of older versions: summary.json's config), "text"}."""
        path = self._in_run(CONFIG)
        mtime = _mtime(path)
        if self._config is None or self._config[0] != mtime:
            text, data = "", {}
            if mtime is not None:
                import yaml

                text = path.read_text(encoding="utf-8")
                try:
                    loaded = yaml.safe_load(text)
                except yaml.YAMLError:
                    loaded = None  # being rewritten (resume) or edited by hand: the text still shows
                data = loaded if isinstance(loaded, dict) else {}
            elif (summary := _json_file(self._in_run(SUMMARY))) is not None:
                data = dict(summary.get("config") or {})
            self._config = (mtime, data, text)
        return {"config": dict(self._config[1]), "text": self._config[2]}

    def log_tail(self, n: int = 200) -> list[str]:
        """The last `n` lines of log.txt, read from the end (a long log is not read whole)."""
        path = self._in_run(LOG)
        if n <= 0 or not path.exists():
            return []
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            data, pos, block = b"", end, 64 * 1024
            while pos > 0 and data.count(b"\n") <= n:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
        lines = data.decode("utf-8", errors="replace").splitlines()
        return lines[-n:]

    # -- episodes -------------------------------------------------------------------------------------------
    def _episodes_path(self, name: str) -> Path:
        if name == EVAL_FILE_NAME and (self._in_run(EVAL_EPISODES)).exists():
            return self._in_run(EVAL_EPISODES)
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise RunReadError(f"{name!r} is not an episodes file name (names look like step_3, eval_step_0, eval)")
        return self._in_run(EPISODES_DIR, f"{name}.jsonl")

    def _index(self, name: str) -> EpisodeIndex:
        path = self._episodes_path(name)
        if not path.is_file():
            names = [f["name"] for f in self.files()]
            raise RunReadError(f"{self.path} has no episodes file {name!r}; it has {names or 'none yet'}")
        idx = self._indexes.get(name)
        if idx is None or idx.path != path:
            idx = self._indexes[name] = EpisodeIndex(path)
        return idx

    def files(self) -> list[dict[str, Any]]:
        """The episodes files, train steps in order, then eval files: name, kind, step, episodes (count)."""
        paths: list[tuple[str, Path]] = []
        if (self._in_run(EVAL_EPISODES)).is_file():
            paths.append((EVAL_FILE_NAME, self._in_run(EVAL_EPISODES)))
        edir = self._in_run(EPISODES_DIR)
        if edir.is_dir():
            with os.scandir(edir) as it:
                for e in it:
                    if e.name.endswith(".jsonl") and e.is_file() and self._inside(Path(e.path)):  # (not .idx)
                        paths.append((e.name[: -len(".jsonl")], Path(e.path)))
        out = []
        for name, _ in paths:
            kind, step = file_kind(name)
            out.append({"name": name, "kind": kind, "step": step, "episodes": len(self._index(name).refresh())})
        order = {"train": 0, "eval": 1, "eval_greedy": 2, "other": 3}
        out.sort(key=lambda f: (f["step"] if f["step"] is not None else -1, order[f["kind"]], f["name"]))
        return out

    def summaries(self, name: str) -> list[dict[str, Any]]:
        """One dict per episode of file `name` (the sidecar's lines, or built from the file where the sidecar
        is missing or behind): index, offset, length, task_id, id, attempt, reward, reason, is_correct,
        termination, n_trajectories, n_steps, response_tokens, has_token_ids, error (≤200 chars or null),
        preview (≤200 chars)."""
        return list(self._index(name).refresh())

    def partial_lines(self, name: str) -> int:
        idx = self._index(name)
        idx.refresh()
        return idx.partial_lines

    def episode(self, name: str, index: int) -> dict[str, Any]:
        """Episode `index` of file `name`, as its JSON dict (`rllm_core.types.Episode.model_validate` turns it
        back into an Episode); read with one seek, never the whole file."""
        try:
            return self._index(name).load(index)
        except IndexError as exc:
            raise RunReadError(str(exc)) from None


_READERS: OrderedDict[Path, RunReader] = OrderedDict()
_MAX_READERS = 256


def open_run(path: str | Path) -> RunReader:
    """A cached RunReader for `path` (the same one on every call), so polls stay incremental."""
    key = Path(path).resolve()
    reader = _READERS.pop(key, None) or RunReader(key)
    _READERS[key] = reader
    while len(_READERS) > _MAX_READERS:
        _READERS.popitem(last=False)
    return reader
