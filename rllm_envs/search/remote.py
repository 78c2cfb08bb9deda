"""A client of the retrieval server (`rllm retrieve serve`): the same `search` / `get` as a local BM25Index.

httpx with a bounded timeout and tenacity retries on connection errors and 503 (the server's "busy" answer to
a full queue), so a worker rides out a short restart or a burst; any other failure is one clear error naming the
server. One client (connection pool) per server URL per process.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import quote

import httpx
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from rllm_core.errors import BenchmarkError
from rllm_envs.search.bm25_index import SearchHit
from rllm_envs.search.corpus import Passage

__all__ = ["RemoteIndex"]


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 503


@functools.lru_cache(maxsize=8)
def _client(base: str, timeout_s: float) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=timeout_s, trust_env=False)


class RemoteIndex:
    """The retrieval server at `url` as a passage source."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = _client(self.url, timeout_s)

    @retry(retry=retry_if_exception(_transient), stop=stop_after_attempt(4),
           wait=wait_exponential(multiplier=0.2, max=2.0), reraise=True)
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        resp = self._http.request(method, path, **kwargs)
        if resp.status_code == 503:
            resp.raise_for_status()
        return resp

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._request(method, path, **kwargs)
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            raise BenchmarkError(f"retrieval server {self.url} failed: {type(exc).__name__}: {exc}") from None

    def search_batch(self, queries: list[str], k: int = 5) -> list[list[SearchHit]]:
        resp = self._call("POST", "/search", json={"queries": queries, "k": k})
        if resp.status_code != 200:
            raise BenchmarkError(f"retrieval server {self.url}: {resp.status_code} {resp.text[:300]}")
        return [[SearchHit.model_validate(h) for h in row] for row in resp.json()["hits"]]

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        return self.search_batch([query], k)[0]

    def get(self, doc_id: str) -> Passage | None:
        resp = self._call("GET", f"/passage/{quote(doc_id.strip(), safe='')}")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise BenchmarkError(f"retrieval server {self.url}: {resp.status_code} {resp.text[:300]}")
        return Passage.model_validate(resp.json())

    def health(self) -> dict[str, Any]:
        resp = self._call("GET", "/health")
        resp.raise_for_status()
        return dict(resp.json())
