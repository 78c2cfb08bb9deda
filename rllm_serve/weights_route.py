"""New weights over HTTP: a trainer on another host updates a running policy server.

    rllm serve --model tiny-random --host 198.18.0.5 --port 8000 --admin-token "$TOKEN"
    PUT  /admin/weights    body: safetensors bytes   Authorization: Bearer TOKEN   [X-Policy-Version: N]
    → {"policy_version": N}

The route exists only when the server has an admin token (`--admin-token` / $RLLM_SERVE_ADMIN_TOKEN): weights
decide what every later rollout samples, so nobody who merely reaches the port may replace them. The body is a
safetensors file (the format made for this: no pickle, so no code runs on load) of some or all of the served
model's parameters, by their names; `update_weights` swaps them in at the next decode step, exactly as the local
backend's in-process push does. `RemotePolicyServer` is the trainer's side.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx
from aiohttp import web

from rllm_core.errors import ConfigError, UpstreamError

if TYPE_CHECKING:
    import torch

__all__ = ["ADMIN_TOKEN_ENV", "RemotePolicyServer", "add_weights_route"]

ADMIN_TOKEN_ENV = "RLLM_SERVE_ADMIN_TOKEN"
MAX_WEIGHTS_BYTES = 64 * 1024**3
"""Largest body the route reads (a 14B model in bf16 fits): a bound, so a wrong client cannot fill memory."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


async def _read_weights(request: web.Request) -> bytes | None:
    """The body, read in chunks under this route's own bound (None past it): the app's `client_max_size`, which
    `request.read()` applies, is sized for chat requests (64 MB), and the embedded model's weights are 540 MB."""
    if (request.content_length or 0) > MAX_WEIGHTS_BYTES:
        return None
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 20):
        size += len(chunk)
        if size > MAX_WEIGHTS_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def add_weights_route(app: web.Application, engine: Any, token: str) -> None:
    """`PUT /admin/weights` on `app`, for `engine` (a DecodeEngine), behind `token` (module docstring)."""

    async def put_weights(request: web.Request) -> web.Response:
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(sent.encode(), token.encode()):
            return _error(401, "PUT /admin/weights needs the server's admin token (Authorization: Bearer TOKEN)")
        version_header = request.headers.get("X-Policy-Version")
        try:
            version = int(version_header) if version_header is not None else None
        except ValueError:
            return _error(400, f"X-Policy-Version must be a whole number, got {version_header!r}")
        body = await _read_weights(request)
        if body is None:
            return _error(413, f"weights over {MAX_WEIGHTS_BYTES} bytes")
        try:
            from safetensors.torch import load

            state_dict = load(body)
        except Exception as exc:  # safetensors says what is wrong with the bytes
            return _error(400, f"the body is not a safetensors file: {exc}")
        try:
            new_version = await asyncio.to_thread(engine.update_weights, state_dict, 300.0, version)
        except ConfigError as exc:  # names that are not the served model's: another model than the trainer's
            return _error(400, str(exc))
        except (RuntimeError, TimeoutError, ValueError) as exc:
            return _error(503, f"the weights were not swapped in: {exc}")
        return web.json_response({"policy_version": new_version, "tensors": len(state_dict)})

    app.router.add_put("/admin/weights", put_weights)


class RemotePolicyServer:
    """The trainer's handle on an `rllm serve --admin-token` running on another host: what the local backend
    needs from its in-process `RunningPolicyServer` (URLs, the model's name, the policy version, new weights)."""

    def __init__(self, url: str, admin_token: str | None, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self._token = admin_token
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.model_name = str(self.health()["model"])

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def health(self) -> dict[str, Any]:
        """The server's /health (model, policy_version, load); UpstreamError when it cannot be reached."""
        try:
            reply = self._http.get(f"{self.url}/health", timeout=10.0)
            reply.raise_for_status()
            return dict(reply.json())
        except (httpx.HTTPError, ValueError) as exc:
            raise UpstreamError(f"the policy server at {self.url} did not answer /health: {exc}") from None

    @property
    def policy_version(self) -> int:
        return int(self.health()["policy_version"])

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], timeout: float | None = None,
                       version: int | None = None) -> int:
        """Push `state_dict` (PUT /admin/weights); the version the server now serves."""
        from safetensors.torch import save

        if not self._token:
            raise UpstreamError(f"pushing weights to {self.url} needs its admin token: set ${ADMIN_TOKEN_ENV} to the "
                                "server's --admin-token")
        body = save(_unshared(state_dict))
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/octet-stream"}
        if version is not None:
            headers["X-Policy-Version"] = str(version)
        try:
            reply = self._http.put(f"{self.url}/admin/weights", content=body, headers=headers,
                                   timeout=timeout or self._http.timeout.read)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"pushing weights to {self.url} failed: {exc}") from None
        if reply.status_code != 200:
            raise UpstreamError(f"the policy server at {self.url} refused the weights ({reply.status_code}): "
                                f"{reply.text[:300]}")
        return int(reply.json()["policy_version"])

    def stop(self) -> None:
        """Close this handle (the server is someone else's to stop)."""
        self._http.close()


def _unshared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors safetensors can write: tied weights (embeddings and lm_head share storage) each get their own
    copy, since the server may keep them apart (a packed lm_head) and must get every name it is sent today."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out
