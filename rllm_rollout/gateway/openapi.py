"""An OpenAPI 3 description of the gateway's HTTP surface (served at GET /openapi.json).

It says what the gateway itself guarantees, no more: an LLM route takes any JSON object (the upstream judges
its fields; the documented ones are what the recorder reads) and answers the upstream's reply, a 400 for a
body that is not a JSON object, 401 without the token, 410 for a closed session, 502/504 when the upstream
failed. Every error is OpenAI-shaped (`{"error": {"message", "type", "code"}}`). tests/test_gateway_fuzz.py
fuzzes a live gateway against it (Schemathesis).
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["OPENAPI", "openapi_document"]

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"],
                             "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                            "code": {}}}},
}
_JSON_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_ANY_JSON = {"content": {"application/json": {"schema": {}}}}
_SESSION = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1},
            "description": "`name~sig`, the signed session URL a rollout hands its agent (no token needed on the "
                           "LLM routes), or a bare name (bearer token needed)."}
_HEADERS = [
    {"name": "X-RLLM-Session", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "The session of a call without the /sessions/{id} prefix (else `default`)."},
    {"name": "X-RLLM-Agent", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "The agent / role recorded on the call's Steps."},
]
_MESSAGE = {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"enum": ["system", "user", "assistant"]}, "content": {"type": "string"}}}
_SAMPLING = {
    "model": {"type": "string"}, "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 2},
    "logprobs": {"type": "boolean"}, "return_token_ids": {"type": "boolean"},
    "user": {"type": "string"},
}
_BODIES = {
    "ChatRequest": {"type": "object", "required": ["model", "messages"], "additionalProperties": True,
                    "properties": {**_SAMPLING, "messages": {"type": "array", "minItems": 1, "items": _MESSAGE}}},
    "CompletionRequest": {"type": "object", "required": ["model", "prompt"], "additionalProperties": True,
                          "properties": {**_SAMPLING, "prompt": {"type": "string"}}},
    "ResponsesRequest": {"type": "object", "required": ["model", "input"], "additionalProperties": True,
                         "properties": {"model": {"type": "string"}, "stream": {"type": "boolean"},
                                        "input": {"type": "string"}, "instructions": {"type": "string"},
                                        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 64}}},
}
_LLM_RESPONSES = {
    "200": {"description": "The upstream's reply (an SSE stream when `stream` is true), recorded as Steps.",
            "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": {}}}},
    "400": {"description": "Not a JSON object, or too large; or the upstream's 400, passed on.", **_JSON_ERROR},
    "401": {"description": "Missing or wrong bearer token.", **_JSON_ERROR},
    "410": {"description": "The session was taken or deleted: start a new session id.", **_JSON_ERROR},
    "502": {"description": "The upstream failed (an errored Step is recorded).", **_JSON_ERROR},
    "504": {"description": "The upstream timed out (an errored Step is recorded).", **_JSON_ERROR},
}
_STEPS = {"200": {"description": "The session's Steps as a JSON list.",
                  "content": {"application/json": {"schema": {"type": "array"}}}},
          "401": {"description": "Missing or wrong bearer token.", **_JSON_ERROR}}


def _llm(op_id: str, body: str, session_in_path: bool) -> dict[str, Any]:
    params = [_SESSION, _HEADERS[1]] if session_in_path else _HEADERS
    return {"post": {"operationId": op_id, "parameters": params,
                     "requestBody": {"required": True, "content": {
                         "application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}}},
                     "responses": _LLM_RESPONSES}}


def _models(op_id: str, session_in_path: bool) -> dict[str, Any]:
    return {"get": {"operationId": op_id, "parameters": [_SESSION] if session_in_path else [],
                    "responses": {"200": {"description": "The upstream's model list.", **_ANY_JSON},
                                  "401": {"description": "Missing or wrong bearer token.", **_JSON_ERROR},
                                  "410": {"description": "The session is closed.", **_JSON_ERROR},
                                  "502": {"description": "The upstream failed.", **_JSON_ERROR},
                                  "504": {"description": "The upstream timed out.", **_JSON_ERROR}}}}


OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "rllm gateway", "version": "1",
             "description": "OpenAI-compatible recording reverse proxy: every call becomes Steps of its session."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {"Error": _ERROR, **_BODIES},
    },
    "security": [{"bearer": []}],
    "paths": {
        "/health": {"get": {"operationId": "health", "security": [],
                            "responses": {"200": {"description": "Up (liveness only).", **_ANY_JSON}}}},
        "/stats": {"get": {"operationId": "stats", "responses": {
            "200": {"description": "Store and lifecycle counters.", **_ANY_JSON},
            "401": {"description": "Missing or wrong bearer token.", **_JSON_ERROR}}}},
        "/sessions/{session_id}/steps": {"get": {"operationId": "getSteps", "parameters": [_SESSION],
                                                 "responses": _STEPS}},
        "/sessions/{session_id}/take": {"post": {
            "operationId": "takeSession",
            "parameters": [_SESSION, {"name": "take_id", "in": "query", "required": False,
                                      "schema": {"type": "string"}}],
            "responses": _STEPS}},
        "/sessions/{session_id}/takes/{take_id}": {"delete": {
            "operationId": "ackTake",
            "parameters": [_SESSION, {"name": "take_id", "in": "path", "required": True,
                                      "schema": {"type": "string", "minLength": 1}}],
            "responses": {"200": {"description": "Whether a kept take reply was forgotten.", **_ANY_JSON},
                          "401": {"description": "Missing or wrong bearer token.", **_JSON_ERROR}}}},
        "/sessions/{session_id}": {"delete": {
            "operationId": "deleteSession", "parameters": [_SESSION],
            "responses": {"200": {"description": "How many Steps were freed.", **_ANY_JSON},
                          "401": {"description": "Missing or wrong bearer token.", **_JSON_ERROR}}}},
        "/sessions/{session_id}/v1/chat/completions": _llm("sessionChat", "ChatRequest", True),
        "/sessions/{session_id}/v1/completions": _llm("sessionCompletions", "CompletionRequest", True),
        "/sessions/{session_id}/v1/responses": _llm("sessionResponses", "ResponsesRequest", True),
        "/sessions/{session_id}/v1/models": _models("sessionModels", True),
        "/v1/chat/completions": _llm("chat", "ChatRequest", False),
        "/v1/completions": _llm("completions", "CompletionRequest", False),
        "/v1/responses": _llm("responses", "ResponsesRequest", False),
        "/v1/models": _models("models", False),
    },
}


def openapi_document(server_url: str | None = None) -> dict[str, Any]:
    """A copy of `OPENAPI`, naming `server_url` as its server when given (what GET /openapi.json serves)."""
    doc = copy.deepcopy(OPENAPI)
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
