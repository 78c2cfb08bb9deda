"""The retrieval server (`rllm retrieve serve`): one index, many rollout workers, over HTTP.

Search-R1, ReSearch and verl's agent loop train against a retrieval server rather than loading the index in each
worker; this is that server, with Search-R1's endpoint so its agents work unchanged:

    POST /retrieve  {"queries": [...], "topk": 3, "return_scores": true}
                    -> {"result": [[{"document": {"id", "title", "text", "contents"}, "score"}, ...], ...]}
    POST /search    {"queries": [...], "k": 5}  -> {"hits": [[{"id", "title", "snippet", "score"}, ...], ...]}
    GET  /passage/{id}                          -> {"id", "title", "text"} or 404
    GET  /health                                -> {"status": "ok", "passages", "index", "in_flight", ...}

Queries run on worker threads, at most `max_concurrency` requests at once; up to `max_queue` more wait, and past
that the server answers 503 with a Retry-After (the client retries) instead of queueing without bound. A batch is
at most `max_batch` queries and `topk` at most `max_k`: past those, a 400 that says the limit. Every error body
is JSON `{"error": "..."}`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from rllm_core.threaded_app import ThreadedApp
from rllm_envs.search.tools import PassageSource

__all__ = ["RetrievalServer"]


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers or None)


class RetrievalServer:
    """Serves `index` (a BM25Index, or a DenseIndex) on host:port; `start()` returns once listening."""

    def __init__(self, index: Any, host: str = "127.0.0.1", port: int = 0, *, kind: str = "bm25",
                 max_concurrency: int = 8, max_queue: int = 256, max_batch: int = 256, max_k: int = 100,
                 corpus: str = "") -> None:
        self.index: PassageSource = index
        self.kind, self.corpus = kind, corpus
        self.max_concurrency, self.max_queue, self.max_batch, self.max_k = (max_concurrency, max_queue, max_batch,
                                                                            max_k)
        self.in_flight = self.waiting = self.served = self.refused = 0
        self._slots: asyncio.Semaphore | None = None
        self._http = ThreadedApp(self._app, host, port, name="rllm-retrieve")

    @property
    def url(self) -> str:
        return self._http.url

    def start(self) -> RetrievalServer:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- the app
    def _app(self) -> web.Application:
        self._slots = asyncio.Semaphore(self.max_concurrency)
        app = web.Application(client_max_size=4 << 20)
        app.router.add_get("/health", self._health)
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_post("/search", self._search)
        app.router.add_get("/passage/{doc_id}", self._passage)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "index": self.kind, "passages": len(self.index),  # type: ignore[arg-type]
                                  "corpus": self.corpus, "in_flight": self.in_flight, "waiting": self.waiting,
                                  "served": self.served, "refused_busy": self.refused,
                                  "max_concurrency": self.max_concurrency})

    async def _queries(self, request: web.Request, k_names: tuple[str, ...]) -> tuple[list[str], int]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _bad("the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object")
        queries = body.get("queries", [body["query"]] if "query" in body else None)
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise _bad('send {"queries": ["...", ...]} (a list of strings)')
        if len(queries) > self.max_batch:
            raise _bad(f"{len(queries)} queries in one request; at most {self.max_batch}")
        k = next((body[n] for n in k_names if n in body), 5)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self.max_k:
            raise _bad(f"{k_names[0]} must be a whole number from 1 to {self.max_k}, got {k!r}")
        return queries, k

    async def _run(self, queries: list[str], k: int) -> list[list[Any]]:
        assert self._slots is not None
        if self._slots.locked() and self.waiting >= self.max_queue:  # no free slot, and the queue is full
            self.refused += 1
            raise web.HTTPServiceUnavailable(text=json.dumps({"error": "busy: the queue is full, retry shortly"}),
                                             content_type="application/json", headers={"Retry-After": "1"})
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.in_flight += 1
        try:
            return await asyncio.to_thread(self.index.search_batch, queries, k)  # type: ignore[attr-defined]
        finally:
            self.in_flight -= 1
            self.served += 1
            self._slots.release()

    async def _search(self, request: web.Request) -> web.Response:
        queries, k = await self._queries(request, ("k", "topk"))
        hits = await self._run(queries, k)
        return web.json_response({"hits": [[h.model_dump() for h in row] for row in hits]})

    async def _retrieve(self, request: web.Request) -> web.Response:
        queries, k = await self._queries(request, ("topk", "k"))
        hits = await self._run(queries, k)
        result = []
        for row in hits:
            docs = []
            for h in row:
                p = self.index.get(h.id)
                text = p.text if p is not None else h.snippet
                docs.append({"document": {"id": h.id, "title": h.title, "text": text,
                                          "contents": f'"{h.title}"\n{text}'}, "score": h.score})
            result.append(docs)
        return web.json_response({"result": result})

    async def _passage(self, request: web.Request) -> web.Response:
        passage = self.index.get(request.match_info["doc_id"])
        if passage is None:
            return _error(404, f"no passage {request.match_info['doc_id']!r}")
        return web.json_response(passage.model_dump())


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")
