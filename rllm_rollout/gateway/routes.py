"""What the gateway answers without an upstream: its OpenAI-style errors, the routes it forwards (and the 404 /
405 for the rest), and /openapi.json. Kept apart from app.py, which is the proxy and the session routes."""

from __future__ import annotations

from aiohttp import web

from rllm_rollout.capture import _json

__all__ = ["LLM_POST_ROUTES", "json_error", "no_route", "not_allowed", "openapi"]

LLM_POST_ROUTES = ("chat/completions", "completions", "responses", "messages", "v1/messages")
"""The only calls forwarded upstream, with GET models[/ID]: a client token must not reach the upstream's
files, batches or fine-tuning with the upstream's key. `v1/messages`: the Anthropic SDK appends /v1/messages
to its base URL, so an agent handed `config.base_url` (which ends in /v1) calls .../v1/v1/messages."""


def json_error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    """An OpenAI-style error body, so SDKs show the message."""
    return web.Response(status=status, body=_json.dumps({"error": {"message": message, "type": kind,
                                                                   "code": status}}),
                        content_type="application/json")


def not_allowed(method: str, tail: str) -> web.Response | None:
    """None for a call the gateway forwards; else the OpenAI-style 404 (no such route) or 405 (wrong method)."""
    route = tail.strip("/")
    if any(part in ("", ".", "..") for part in route.split("/")):  # `models/..%2ffiles` must not reach /v1/files
        return json_error(404, f"no route {method} /v1/{route} through the gateway: a path with empty, '.' or '..' "
                               "segments is never forwarded", "not_found_error")
    is_models = route == "models" or route.startswith("models/")
    if (method == "POST" and route in LLM_POST_ROUTES) or (method == "GET" and is_models):
        return None
    allowed = "POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and GET /v1/models"
    if route in LLM_POST_ROUTES or is_models:
        resp = json_error(405, f"{method} /v1/{route} is not allowed: the gateway forwards only {allowed}",
                          "method_not_allowed")
        resp.headers["Allow"] = "POST" if route in LLM_POST_ROUTES else "GET"
        return resp
    return json_error(404, f"no route {method} /v1/{route} through the gateway: it forwards only {allowed} (files, "
                           "batches, fine-tuning, embeddings ... never reach the upstream)", "not_found_error")


async def openapi(request: web.Request) -> web.Response:
    """The gateway's routes as OpenAPI 3 (gateway/openapi.py); open like /health: it holds no secret."""
    from rllm_rollout.gateway.openapi import openapi_document

    return web.json_response(openapi_document(f"{request.scheme}://{request.host}"))


async def no_route(request: web.Request) -> web.Response:
    """An unknown path (often a base URL missing /v1) gets an OpenAI-shaped 404 that says where calls go,
    instead of aiohttp's plain-text one, which SDKs show as just '404: Not Found'. A known path with the wrong
    method gets a 405 naming the right ones (this catch-all would otherwise hide aiohttp's own 405)."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        match, methods = await resource.resolve(request)
        if match is None:
            allowed |= methods
    if allowed:
        resp = json_error(405, f"{request.method} {request.path} is not allowed; use {', '.join(sorted(allowed))}",
                          "method_not_allowed")
        resp.headers["Allow"] = ", ".join(sorted(allowed))
        return resp
    return json_error(404, f"no route {request.method} {request.path} here; send OpenAI calls to "
                           "/sessions/<id>/v1/... (or /v1/... with an X-RLLM-Session header); read them at "
                           "GET /sessions/<id>/steps", kind="not_found_error")

