"""The JSON API of `rllm view`: what the page reads about the runs below one root folder.

Every endpoint takes ``run=ID``, the run's path relative to the root (``.`` when the root is itself a run),
and answers JSON; a bad parameter is a 400 and an unknown run or file a 404, each ``{"error": "..."}``
saying what was wrong.

    GET /api/runs                                   {"root", "runs": [{"id", "kind", "status", ...}]}
    GET /api/metrics?run&since=K                    {"records", "next", "partial_lines"}  (poll with since=next)
    GET /api/config?run                             {"config", "text"}
    GET /api/log?run&lines=200                      {"lines"}
    GET /api/files?run                              {"files": [{"name", "kind", "step", "episodes"}]}
    GET /api/episodes?run&file&offset&limit&q&reward=zero|nonzero&reason=R
                                                    {"total", "offset", "limit", "items": [...]}
    GET /api/episode?run&file&index                 one episode for the viewer (rllm_monitor.tokens)
    GET /api/groups?run&file                        {"groups": [{"task_id", "indices", "rewards", ...}]}
    GET /api/diagnosis?run                          {"reasons", "steps": [per-file breakdown]}

All of it is read from the run reader's episode index (rllm_core.runs), cached per file while the file does
not change, so paging, search and diagnosis never parse the episodes; only /api/episode reads one episode.
Search (``q``) is a case-insensitive substring match over the index's preview (the first 200 characters of
the episode's text), its task id and its reason — not the full episode text, which would mean reading the
whole file on every keystroke.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from rllm_core.runs.reader import RunReader, RunReadError, find_runs
from rllm_monitor.diagnosis import StepDiagnosis, as_dict, diagnose_file, group_rows, is_zero, zero_reason
from rllm_monitor.tokens import TokenizerCache, render_episode

__all__ = ["MAX_LIMIT", "ApiError", "ViewState", "add_routes"]

MAX_LIMIT = 500
"""Most episodes in one page of /api/episodes: the page asks for 50; nobody reads 10,000 rows at once."""
RUNS_TTL_S = 2.0
"""How long the list of run folders is reused: walking a root with many checkpoints is not free, and the page
polls it."""


class ApiError(Exception):
    """A request the API cannot answer: the server's middleware turns it into ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json_text(obj: Any) -> str:
    """Strict JSON: a metric of NaN or 1e309 (inf) would be written as `NaN` / `Infinity`, which a browser's
    JSON.parse refuses, so that run's curves would not load at all; such a value is sent as null (a gap)."""
    import json

    try:
        return json.dumps(obj, default=str, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), default=str, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _int_param(request: web.Request, name: str, default: int | None, low: int = 0,
               high: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ApiError(400, f"missing parameter {name}= (an integer)")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name}={raw!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ApiError(400, f"{name}={value} is out of range: give a value {span}")
    return value


class ViewState:
    """The root being viewed and what is cached about its runs (readers, episode indexes, tokenizers)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.readers: dict[Path, RunReader] = {}
        self.tokenizers = TokenizerCache()
        self._runs: tuple[float, list[Path]] | None = None
        self._diagnoses: dict[tuple[Path, str], tuple[tuple[int, int], StepDiagnosis]] = {}
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rllm-view-io")

    async def io(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a reader call off the event loop (a first read of a big run takes a while; the page's live
        polling must not wait on it), on one worker thread: the readers' caches are not shared between threads."""
        return await asyncio.get_running_loop().run_in_executor(self._io, functools.partial(fn, *args, **kwargs))

    # ------------------------------------------------------------------ runs
    def run_paths(self) -> list[Path]:
        now = time.monotonic()
        if self._runs is None or now - self._runs[0] > RUNS_TTL_S:
            self._runs = (now, [Path(p).resolve() for p in find_runs(self.root)])
        return self._runs[1]

    def run_id(self, path: Path) -> str:
        rel = path.relative_to(self.root).as_posix()
        return rel or "."

    def reader(self, request: web.Request) -> RunReader:
        """The reader of ?run=ID; 400 without it, 404 for anything that is not a run below the root."""
        run_id = request.query.get("run")
        if not run_id:
            raise ApiError(400, "missing parameter run= (a run id from /api/runs)")
        path = (self.root / unquote(run_id)).resolve()
        if path != self.root and self.root not in path.parents:
            raise ApiError(404, f"run {run_id!r} is outside the viewed folder {self.root}")
        if path not in self.readers:
            reader = RunReader(path)
            if not reader.is_run():
                raise ApiError(404, f"no run {run_id!r} under {self.root}; /api/runs lists the runs")
            self.readers[path] = reader
        return self.readers[path]

    # ------------------------------------------------------------------ episode index
    def files(self, reader: RunReader) -> list[dict[str, Any]]:
        return [as_dict(f) for f in reader.files()]

    def file_entry(self, reader: RunReader, name: str | None) -> dict[str, Any]:
        if not name:
            raise ApiError(400, "missing parameter file= (a file name from /api/files)")
        files = self.files(reader)
        for f in files:
            if f.get("name") == name:
                return f
        names = ", ".join(str(f.get("name")) for f in files[:20]) or "none"
        raise ApiError(404, f"run has no episodes file {name!r}; it has: {names}")

    def summaries(self, reader: RunReader, name: str) -> list[dict[str, Any]]:
        """The file's episode summaries: the reader keeps its index and reads only what was appended."""
        return reader.summaries(name)

    def diagnosis(self, reader: RunReader, file: dict[str, Any]) -> StepDiagnosis:
        """One file's breakdown, reused while the file has the same episodes (files only grow; a rewritten one
        gets new summary objects, so the identity of its last one tells them apart)."""
        rows = self.summaries(reader, str(file["name"]))
        key, sig = (Path(reader.path), str(file["name"])), (len(rows), id(rows[-1]) if rows else 0)
        cached = self._diagnoses.get(key)
        if cached is None or cached[0] != sig:
            cached = self._diagnoses[key] = (sig, diagnose_file(file, rows))
        return cached[1]


# ---------------------------------------------------------------------- handlers
def _item(index: int, s: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "task_id": s.get("task_id"), "reward": s.get("reward"), "reason": s.get("reason"),
            "is_correct": s.get("is_correct"), "n_trajectories": s.get("n_trajectories"),
            "n_steps": s.get("n_steps"), "response_tokens": s.get("response_tokens"),
            "has_token_ids": s.get("has_token_ids"), "preview": s.get("preview") or "", "error": s.get("error")}


def _matches(s: dict[str, Any], q: str, reward: str | None, reason: str | None) -> bool:
    if reward == "zero" and not is_zero(s.get("reward")):
        return False
    if reward == "nonzero" and is_zero(s.get("reward")):
        return False
    if reason:
        if reward == "zero":  # the diagnosis's own count: one reason per zero-reward episode, the link lists those
            if zero_reason(s) != reason:
                return False
        elif s.get("reason") != reason and not (is_zero(s.get("reward")) and zero_reason(s) == reason):
            return False  # a diagnosis reason (empty_token_ids...) also finds the episodes it counted
    if q:
        hay = f"{s.get('preview') or ''}\n{s.get('task_id') or ''}\n{s.get('reason') or ''}".lower()
        return q in hay
    return True


def _handlers(state: ViewState) -> dict[str, Callable[[web.Request], Any]]:
    async def runs(request: web.Request) -> web.Response:
        return web.json_response({"root": str(state.root), "runs": await state.io(_runs)}, dumps=_json_text)

    def _runs() -> list[dict[str, Any]]:
        out = []
        for path in state.run_paths():
            entry: dict[str, Any] = {"id": state.run_id(path)}
            try:
                reader = state.readers.get(path) or state.readers.setdefault(path, RunReader(path))
                entry.update(as_dict(reader.info()))
            except Exception as exc:  # one unreadable run must not hide the others
                entry.update(status="failed", error=f"cannot read this run: {type(exc).__name__}: {exc}")
            entry["id"] = state.run_id(path)
            out.append(entry)
        return out

    async def metrics(request: web.Request) -> web.Response:
        reader = state.reader(request)
        records, nxt, partial = await state.io(reader.metrics, since=_int_param(request, "since", 0))
        return web.json_response({"records": records, "next": nxt, "partial_lines": partial}, dumps=_json_text)

    async def config(request: web.Request) -> web.Response:
        cfg = await state.io(state.reader(request).config)
        return web.json_response({"config": cfg["config"], "text": cfg["text"]}, dumps=_json_text)

    async def log_tail(request: web.Request) -> web.Response:
        reader = state.reader(request)
        n = _int_param(request, "lines", 200, low=1, high=10_000)
        return web.json_response({"lines": list(await state.io(reader.log_tail, n))}, dumps=_json_text)

    async def files(request: web.Request) -> web.Response:
        reader = state.reader(request)
        return web.json_response({"files": await state.io(state.files, reader)}, dumps=_json_text)

    async def episodes(request: web.Request) -> web.Response:
        reader = state.reader(request)
        name = str(state.file_entry(reader, request.query.get("file"))["name"])
        offset = _int_param(request, "offset", 0)
        limit = _int_param(request, "limit", 50, low=1, high=MAX_LIMIT)
        reward = request.query.get("reward") or None
        if reward not in (None, "zero", "nonzero"):
            raise ApiError(400, f"reward={reward!r}: give reward=zero or reward=nonzero (or leave it out)")
        q = (request.query.get("q") or "").strip().lower()
        reason = request.query.get("reason") or None
        rows = await state.io(state.summaries, reader, name)
        if q or reward or reason:
            hits = [i for i, s in enumerate(rows) if _matches(s, q, reward, reason)]
            items = [_item(i, rows[i]) for i in hits[offset:offset + limit]]
            total = len(hits)
        else:
            items = [_item(i, rows[i]) for i in range(offset, min(offset + limit, len(rows)))]
            total = len(rows)
        return web.json_response({"total": total, "offset": offset, "limit": limit, "items": items},
                                 dumps=_json_text)

    async def episode(request: web.Request) -> web.Response:
        reader = state.reader(request)
        entry = state.file_entry(reader, request.query.get("file"))
        index = _int_param(request, "index", None)
        count = entry.get("episodes")
        if isinstance(count, int) and index >= count:
            raise ApiError(404, f"file {entry['name']!r} has {count} episodes (index 0 to {count - 1}); "
                                f"there is no episode {index}")
        try:
            ep = await state.io(reader.episode, str(entry["name"]), index)
        except RunReadError as exc:
            raise ApiError(404, str(exc)) from None
        cfg = (await state.io(reader.config))["config"]
        model = cfg.get("served_model") or cfg.get("model")
        tokenizer = await asyncio.to_thread(state.tokenizers.get, model)  # the first load takes a few seconds
        return web.json_response(render_episode(ep, index, tokenizer), dumps=_json_text)

    async def groups(request: web.Request) -> web.Response:
        reader = state.reader(request)
        name = str(state.file_entry(reader, request.query.get("file"))["name"])
        rows = group_rows(await state.io(state.summaries, reader, name))
        return web.json_response({"groups": [g.model_dump() for g in rows]}, dumps=_json_text)

    async def diagnosis(request: web.Request) -> web.Response:
        reader = state.reader(request)
        steps = await state.io(lambda: [state.diagnosis(reader, f) for f in state.files(reader)])
        reasons = sorted({r for s in steps for r in s.reasons})
        return web.json_response({"reasons": reasons, "steps": [s.model_dump() for s in steps]}, dumps=_json_text)

    async def media(request: web.Request) -> web.StreamResponse:
        """One stored image of the run (`<run>/media/<sha256>.<ext>`), by the name a step's message gives."""
        reader = state.reader(request)
        name = request.query.get("name") or ""
        if not _MEDIA_NAME.match(name):
            raise ApiError(400, f"name={name[:80]!r}: give a stored image's name, <sha256>.<png|jpg|gif|webp>")
        path = reader.path / "media" / name
        if not path.is_file():
            raise ApiError(404, f"the run has no stored image {name}")
        return web.FileResponse(path, headers={"Cache-Control": "max-age=86400", "X-Content-Type-Options": "nosniff"})

    return {"runs": runs, "metrics": metrics, "config": config, "log": log_tail, "files": files,
            "episodes": episodes, "episode": episode, "groups": groups, "diagnosis": diagnosis, "media": media}


_MEDIA_NAME = re.compile(r"^[0-9a-f]{64}\.(png|jpg|gif|webp)$")


def add_routes(app: web.Application, state: ViewState) -> None:
    """GET /api/<name> for every handler above."""
    for name, handler in _handlers(state).items():
        app.router.add_get(f"/api/{name}", handler)
