"""What a rollout needs from a gateway, and a client for one running in another process.

`Rollout.arun(gateway=...)` and the engines take anything shaped like `GatewayClient`: the in-process
`GatewayHandle`, or `RemoteGateway` for a gateway started elsewhere (`rllm gateway`, or the driver's gateway
seen from a Ray worker). Episodes then record through the one gateway wherever their code runs.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Protocol, runtime_checkable

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from rllm_core.errors import UpstreamError
from rllm_core.types import Step
from rllm_rollout.gateway.capability import session_segment
from rllm_rollout.gateway.store import IN_FLIGHT_HEADER, TakeResult

__all__ = ["GatewayClient", "RemoteGateway", "TakeResult"]

log = logging.getLogger("rllm.gateway")

_RETRIED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
"""What a gateway restart looks like from here: refused, reset, or closed without a reply. Not a read timeout:
that is a gateway that is up and slow, and retrying would only double its work."""


@runtime_checkable
class GatewayClient(Protocol):
    """The gateway as a rollout sees it: per-session base URLs in, recorded Steps out."""

    url: str

    @property
    def client_api_key(self) -> str | None:
        """The bearer token agents must send to this gateway (None: a gateway without auth)."""
        ...

    def session_base_url(self, session_id: str) -> str:
        """The OpenAI base URL (ending in /v1) whose calls are recorded under `session_id`."""
        ...

    async def atake(self, session_id: str) -> TakeResult:
        """Return the session's Steps, free them and close the session; `in_flight` is how many of its calls
        were still running (their steps arrive too late for the episode and are dropped, counted)."""
        ...

    async def atake_steps(self, session_id: str) -> list[Step]:
        """`atake(...).steps`, for callers that need only the Steps."""
        ...


class RemoteGateway:
    """A gateway in another process, reached over HTTP (`POST /sessions/{id}/take`).

    It pickles (its HTTP client is made on first use in each process), so a driver can hand it to Ray workers.
    A connection refused or reset (the gateway restarting, e.g. `rllm gateway --store sqlite:PATH` on the same
    port) is retried with exponential backoff for up to `retry_s` seconds. A take sends a fresh take id and acks
    it once it has the reply, so a take retried after a lost reply gets the same Steps rather than none.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 30.0, retry_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._http: httpx.Client | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_http": None}

    def __repr__(self) -> str:
        return f"<RemoteGateway {self.url}>"

    @property
    def client_api_key(self) -> str | None:
        return self._api_key

    def session_base_url(self, session_id: str) -> str:
        """The session's URL, signed with the token this client holds (capability.py): minted here, in the
        worker, with no round trip to the gateway."""
        return f"{self.url}/sessions/{session_segment(session_id, self._api_key)}/v1"

    def _call(self, method: str, path: str, params: dict[str, str] | None = None,
              retry_s: float | None = None) -> httpx.Response:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._http = httpx.Client(headers=headers, timeout=self._timeout_s)
        http = self._http
        retrying = Retrying(retry=retry_if_exception_type(_RETRIED), reraise=True,
                            stop=stop_after_delay(self._retry_s if retry_s is None else retry_s),
                            wait=wait_exponential(multiplier=0.05, max=2.0),
                            before_sleep=lambda rs: log.info("gateway %s unreachable (%r); retrying", self.url,
                                                             rs.outcome.exception() if rs.outcome else None))
        try:
            resp = retrying(http.request, method, f"{self.url}{path}", params=params)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"gateway {self.url} unreachable ({type(exc).__name__}: {exc}) after retrying "
                                f"for {self._retry_s:g} s; is `rllm gateway` running there?") from exc
        if resp.status_code == 401:
            raise UpstreamError(f"gateway {self.url} refused the token: pass the token it printed (or its "
                                "--api-key / RLLM_GATEWAY_API_KEY) as api_key=")
        if resp.status_code != 200:
            raise UpstreamError(f"gateway {self.url}{path} answered HTTP {resp.status_code}: {resp.text[:300]}")
        return resp

    def steps(self, session_id: str) -> list[Step]:
        return [Step.model_validate(s) for s in self._call("GET", f"/sessions/{session_id}/steps").json()]

    def take(self, session_id: str) -> TakeResult:
        """Take the session (see `GatewayClient.atake`), surviving a gateway restart between request and reply."""
        take_id = uuid.uuid4().hex
        resp = self._call("POST", f"/sessions/{session_id}/take", params={"take_id": take_id})
        result = TakeResult(steps=[Step.model_validate(s) for s in resp.json()],
                            in_flight=int(resp.headers.get(IN_FLIGHT_HEADER, "0")))
        try:  # best effort: an unacked reply is dropped after the gateway's take grace anyway
            self._call("DELETE", f"/sessions/{session_id}/takes/{take_id}", retry_s=0)
        except UpstreamError as exc:
            log.debug("could not ack take %s of session %s: %s", take_id, session_id, exc)
        return result

    async def atake(self, session_id: str) -> TakeResult:
        return await asyncio.to_thread(self.take, session_id)

    def take_steps(self, session_id: str) -> list[Step]:
        return self.take(session_id).steps

    async def atake_steps(self, session_id: str) -> list[Step]:
        return (await self.atake(session_id)).steps

    def stats(self) -> dict[str, Any]:
        """The gateway's counters (`GET /stats`): late steps, expiries, drops, calls in flight."""
        return dict(self._call("GET", "/stats").json())

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
