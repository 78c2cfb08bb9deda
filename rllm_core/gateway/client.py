"""What a rollout needs from a gateway, and a client for one running in another process.

`Rollout.arun(gateway=...)` and the engines take anything shaped like `GatewayClient`: the in-process
`GatewayHandle`, or `RemoteGateway` for a gateway started elsewhere (`rllm gateway`, or the driver's gateway
seen from a Ray worker). Episodes then record through the one gateway wherever their code runs.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

import httpx

from rllm_core.errors import UpstreamError
from rllm_core.types import Step

__all__ = ["GatewayClient", "RemoteGateway"]


@runtime_checkable
class GatewayClient(Protocol):
    """The gateway as a rollout sees it: per-session base URLs in, recorded Steps out."""

    url: str

    @property
    def client_api_key(self) -> str | None:
        """The bearer token agents must send to this gateway (None: any)."""
        ...

    def session_base_url(self, session_id: str) -> str:
        """The OpenAI base URL (ending in /v1) whose calls are recorded under `session_id`."""
        ...

    async def atake_steps(self, session_id: str) -> list[Step]:
        """Return the session's Steps and free them."""
        ...


class RemoteGateway:
    """A gateway in another process, reached over HTTP (`POST /sessions/{id}/take`).

    It pickles (its HTTP client is made on first use in each process), so a driver can hand it to Ray workers.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._http: httpx.Client | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_http": None}

    def __repr__(self) -> str:
        return f"<RemoteGateway {self.url}>"

    @property
    def client_api_key(self) -> str | None:
        return self._api_key

    def session_base_url(self, session_id: str) -> str:
        return f"{self.url}/sessions/{session_id}/v1"

    def _call(self, method: str, path: str) -> httpx.Response:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._http = httpx.Client(headers=headers, timeout=self._timeout_s)
        try:
            resp = self._http.request(method, f"{self.url}{path}")
        except httpx.HTTPError as exc:
            raise UpstreamError(f"gateway {self.url} unreachable ({type(exc).__name__}: {exc}); "
                                "is `rllm gateway` running there?") from exc
        if resp.status_code == 401:
            raise UpstreamError(f"gateway {self.url} refused the token: pass its --api-key as api_key=")
        if resp.status_code != 200:
            raise UpstreamError(f"gateway {self.url}{path} answered HTTP {resp.status_code}: {resp.text[:300]}")
        return resp

    def steps(self, session_id: str) -> list[Step]:
        return [Step.model_validate(s) for s in self._call("GET", f"/sessions/{session_id}/steps").json()]

    def take_steps(self, session_id: str) -> list[Step]:
        return [Step.model_validate(s) for s in self._call("POST", f"/sessions/{session_id}/take").json()]

    async def atake_steps(self, session_id: str) -> list[Step]:
        return await asyncio.to_thread(self.take_steps, session_id)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
