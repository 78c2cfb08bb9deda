"""A fake upstream that fails a chosen share of calls, and a load driver that proves the gateway loses none.

`FaultyUpstream` is `FakeUpstream` (same deterministic tokens: `encode`, `token_logprob`) except that a call
whose prompt carries a marker (`MARK-s<session>-c<call>`) fails when `fault_for(marker, seed, rate)` says so:

- `http500`: an OpenAI-style 500 body;
- `reset`: a TCP reset (SO_LINGER 0) after the first SSE event of a stream, or half-way through a JSON body;
- `stall`: silence for `stall_s` (longer than the gateway's `UpstreamConfig.timeout_s`) before the reply or
  after a stream's first event.

The choice is a hash of the seed and the marker, not of arrival order, so the driver knows every call's
fate without asking, however the calls interleave. `run_session` plays one session's calls through a gateway
(or straight at the upstream, for a latency baseline), takes its Steps, and `verify` checks what a training
run depends on: one Step per call, in the caller's session, errored exactly when a fault was injected, and
a clean Step's ids and logprobs exactly the upstream's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web
from pydantic import BaseModel, Field

from rllm_core.threaded_app import ThreadedApp
from rllm_core.types import Step
from rllm_testing.fake_upstream import FakeUpstream, _prompt_ids, encode, token_logprob

__all__ = ["FAULT_KINDS", "CallOutcome", "CallSpec", "FaultyUpstream", "LoadReport", "fault_for", "marker_of",
           "plan_calls", "run_session", "start_faulty_upstream", "verify"]

FaultKind = Literal["http500", "reset", "stall"]
FAULT_KINDS: tuple[FaultKind, ...] = ("http500", "reset", "stall")
Kind = Literal["chat", "completions", "responses"]
_MARKER = re.compile(r"MARK-s\d+-c\d+")
_ROUTE = {"chat": "chat/completions", "completions": "completions", "responses": "responses"}


def fault_for(marker: str, seed: int, rate: float) -> FaultKind | None:
    """The fault injected into the call with this marker (None: served normally); a pure function of its
    arguments, so the upstream and the verifier agree without talking."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{marker}".encode()).digest()[:8], "big") / 2**64
    return FAULT_KINDS[min(2, int(h / rate * 3))] if h < rate else None


def marker_of(obj: Any) -> str | None:
    """The first marker in a request body or Step's prompt (messages, prompt, input), else in its `user`."""
    for part in (obj.get("messages"), obj.get("prompt"), obj.get("input"), obj.get("user"),
                 (obj.get("params") or {}).get("user")):
        if part and (m := _MARKER.search(part if isinstance(part, str) else json.dumps(part))):
            return m.group(0)
    return None


# ---------------------------------------------------------------------------------------------- the upstream
@dataclass
class FaultyUpstream(FakeUpstream):
    seed: int = 0
    fault_rate: float = 0.05
    stall_s: float = 2.0
    injected: dict[str, str] = field(default_factory=dict)
    """Marker -> fault kind, for every fault actually injected (the verifier cross-checks its own plan)."""

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", lambda r: self._faulty(r, "chat", self._chat))
        app.router.add_post("/v1/completions", lambda r: self._faulty(r, "completions", self._completions))
        app.router.add_post("/v1/responses", lambda r: self._faulty(r, "responses", self._responses))
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
        app.router.add_get("/faults", lambda r: web.json_response(dict(Counter(self.injected.values()))))
        return app

    async def _faulty(self, request: web.Request, kind: Kind,
                      serve: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            body = await request.json()  # aiohttp keeps the bytes: `serve` reads them again
            n = body.get("n") if isinstance(body, dict) else None
            if n is not None and (type(n) is not int or not 1 <= n <= 16):  # vLLM checks n too; n=10**9 would
                raise ValueError(f"n must be an integer in [1, 16], got {n!r}")  # hang this loop building choices
            marker = marker_of(body) if isinstance(body, dict) else None
            fault = fault_for(marker, self.seed, self.fault_rate) if marker else None
            if fault is None:
                return await serve(request)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            if request.writer is not None and request.writer.output_size:
                raise  # mid-reply: aiohttp drops the connection, a second response would be garbage
            # A body the fake cannot serve gets vLLM's answer, a 400: behind a gateway, a 5xx is then only
            # an injected fault or the gateway's own (what tests/test_gateway_fuzz.py relies on).
            return web.json_response({"error": {"message": f"bad request: {type(exc).__name__}: {exc}",
                                                "type": "BadRequestError", "code": 400}}, status=400)
        self.injected[marker] = fault  # type: ignore[index]
        if fault == "http500":
            return web.json_response({"error": {"message": f"injected fault for {marker}", "type": "server_error",
                                                "code": 500}}, status=500)
        if not body.get("stream"):
            if fault == "stall":
                await asyncio.sleep(self.stall_s)
                return web.json_response({"error": {"message": "stalled past the gateway timeout"}}, status=500)
            resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "400"})
            await resp.prepare(request)
            await resp.write(b'{"id": "cut", "object": "chat.completion", "choices": [{"index": 0, ')
            return await self._reset(request, resp)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_first_event(kind))
        if fault == "stall":
            await asyncio.sleep(self.stall_s)
            return resp
        return await self._reset(request, resp)

    @staticmethod
    async def _reset(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        """Send a TCP RST (not a clean FIN) once what was written has had a moment to leave."""
        await asyncio.sleep(0.005)
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        return resp


def _first_event(kind: Kind) -> bytes:
    """A valid first SSE event of each endpoint's stream, so the fault lands mid-stream, not before it."""
    if kind == "responses":
        start = {"id": "resp_cut", "object": "response", "status": "in_progress", "output": []}
        return b"event: response.created\ndata: " + json.dumps({"type": "response.created", "sequence_number": 0,
                                                                "response": start}).encode() + b"\n\n"
    choice = ({"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}
              if kind == "chat" else {"index": 0, "text": "ok", "finish_reason": None})
    return b"data: " + json.dumps({"id": "cut", "choices": [choice]}).encode() + b"\n\n"


@contextmanager
def start_faulty_upstream(seed: int = 0, fault_rate: float = 0.05, stall_s: float = 2.0) -> Iterator[FaultyUpstream]:
    """Serve a FaultyUpstream on 127.0.0.1:<free port> from a background thread; always stopped on exit
    (stalled handlers are cancelled, not waited for)."""
    if not 0 <= fault_rate < 1:
        raise ValueError(f"fault_rate must be in [0, 1), got {fault_rate}")
    up = FaultyUpstream(seed=seed, fault_rate=fault_rate, stall_s=stall_s)
    http = ThreadedApp(up.make_app, name="rllm-faulty-upstream", shutdown_timeout=0.5).start(10)
    up.url = http.url
    try:
        yield up
    finally:
        http.stop(timeout=15, last=_cancel_rest)


async def _cancel_rest() -> None:
    """Cancel handlers still stalled after the runner's grace, so the loop closes with no pending task."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


# ---------------------------------------------------------------------------------------------- the load
@dataclass(frozen=True, slots=True)
class CallSpec:
    """One planned call: which session makes it, its marker, endpoint and whether it streams."""

    session: str
    marker: str
    kind: Kind
    stream: bool

    @property
    def prompt_text(self) -> str:
        return f"{self.marker} please answer briefly"

    def body(self, direct: bool = False) -> dict[str, Any]:
        """The request body; `direct` adds what the gateway would inject, so a direct baseline does the same
        upstream work."""
        b: dict[str, Any] = {"model": "fake-model", "stream": self.stream, "user": self.marker}
        if self.kind == "chat":
            b["messages"] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": self.prompt_text}]
        elif self.kind == "completions":
            b["prompt"] = self.prompt_text
        else:
            b["input"] = self.prompt_text
        if direct and self.kind == "responses":
            b.update(include=["message.output_text.logprobs"], top_logprobs=0, enable_response_messages=True)
        elif direct:
            b.update(logprobs=True, return_token_ids=True)
        return b

    @property
    def reply(self) -> str:
        """What the fake upstream's default responder answers: the last user text, cut at 24 characters."""
        return f"ok: {self.prompt_text[:24]}"


def plan_calls(n_calls: int, n_sessions: int, seed: int, prefix: str = "load") -> dict[str, list[CallSpec]]:
    """`n_calls` calls dealt round-robin to `n_sessions` sessions: 40 % chat, 35 % streamed chat, 8 % + 7 %
    completions (plain, streamed), 5 % + 5 % Responses API; the mix drawn from the seed."""
    import random

    rng = random.Random(seed)
    kinds: list[tuple[Kind, bool]] = [("chat", False), ("chat", True), ("completions", False),
                                      ("completions", True), ("responses", False), ("responses", True)]
    weights = [40, 35, 8, 7, 5, 5]
    plan: dict[str, list[CallSpec]] = {f"{prefix}-s{s:03d}": [] for s in range(n_sessions)}
    sessions = list(plan)
    for i in range(n_calls):
        sid = sessions[i % n_sessions]
        kind, stream = rng.choices(kinds, weights)[0]
        plan[sid].append(CallSpec(sid, f"MARK-s{i % n_sessions:03d}-c{i:06d}", kind, stream))
    return plan


@dataclass(slots=True)
class CallOutcome:
    """What the client saw of one call."""

    spec: CallSpec
    status: int
    complete: bool
    """A whole reply: 200 and a parsed body, or a stream that reached its end marker."""
    text_ok: bool
    latency_s: float


async def _one_call(http: aiohttp.ClientSession, base_url: str, headers: dict[str, str], spec: CallSpec,
                    direct: bool) -> CallOutcome:
    t0 = time.perf_counter()
    status, complete, text_ok = 0, False, False
    try:
        async with http.post(f"{base_url}/{_ROUTE[spec.kind]}", json=spec.body(direct), headers=headers) as resp:
            status = resp.status
            raw = await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        return CallOutcome(spec, status, False, False, time.perf_counter() - t0)
    latency = time.perf_counter() - t0
    if status == 200 and spec.stream:
        end = b"event: response.completed" if spec.kind == "responses" else b"data: [DONE]"
        complete = end in raw
        text_ok = complete and _streamed_text(spec.kind, raw) == spec.reply
    elif status == 200:
        try:
            data = json.loads(raw)
            text = (data["choices"][0]["message"]["content"] if spec.kind == "chat" else data["choices"][0]["text"]
                    if spec.kind == "completions" else data["output"][0]["content"][0]["text"])
            complete, text_ok = True, text == spec.reply
        except (ValueError, KeyError, IndexError, TypeError):
            pass
    return CallOutcome(spec, status, complete, text_ok, latency)


def _streamed_text(kind: Kind, raw: bytes) -> str | None:
    """The reply text a client assembles from a stream's deltas (None: an event that is not JSON)."""
    parts = []
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            return None
        if kind == "responses":
            parts.append(event.get("delta", "") if event.get("type") == "response.output_text.delta" else "")
        else:
            for ch in event.get("choices") or []:
                parts.append((ch.get("delta") or {}).get("content") or "" if kind == "chat" else ch.get("text") or "")
    return "".join(parts)


async def run_session(http: aiohttp.ClientSession, base_url: str, token: str | None, specs: list[CallSpec], *,
                      take: Callable[[str], Awaitable[list[Step]]] | None = None, direct: bool = False,
                      on_call: Callable[[], None] | None = None) -> tuple[list[CallOutcome], list[Step]]:
    """Make a session's calls one after another (as one agent does), then, given `take`, take its Steps
    (a session's calls may be played in several parts: only the last takes, since a take closes it).
    `direct`: `base_url` is the upstream itself (a baseline), so send what the gateway would inject."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    outcomes = []
    for spec in specs:
        outcomes.append(await _one_call(http, base_url, headers, spec, direct))
        if on_call is not None:
            on_call()
    steps = await take(specs[0].session) if take is not None and specs else []
    return outcomes, steps


# ---------------------------------------------------------------------------------------------- the check
class LoadReport(BaseModel):
    """What `verify` found; `ok` only when nothing was lost, duplicated, misattributed or mis-recorded."""

    calls: int = 0
    steps: int = 0
    faults_planned: dict[str, int] = Field(default_factory=dict)
    lost: int = 0
    """Calls with no Step at all."""
    duplicated: int = 0
    """Steps beyond the first for one call."""
    misattributed: int = 0
    """Steps taken from a session other than their call's."""
    unmarked: int = 0
    """Steps carrying no marker (not from this load)."""
    fault_not_errored: int = 0
    """Injected failures whose Step has no error."""
    clean_errored: int = 0
    """Served calls whose Step has an error."""
    tokens_wrong: int = 0
    """Clean Steps whose ids, logprobs or text differ from the upstream's deterministic tokens."""
    client_wrong: int = 0
    """Calls whose client-side outcome contradicts their fate (a fault seen as a whole reply, or the reverse)."""
    examples: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.misattributed or self.unmarked or self.fault_not_errored
                    or self.clean_errored or self.tokens_wrong or self.client_wrong)


def _tokens_ok(spec: CallSpec, step: Step) -> bool:
    ids = encode(spec.reply)
    prompt = _prompt_ids({"input": spec.prompt_text} if spec.kind == "responses" else spec.body())
    return (step.completion_token_ids == ids and step.logprobs == [token_logprob(t) for t in ids]
            and step.prompt_token_ids == prompt and step.text == spec.reply and step.endpoint == spec.kind
            and step.token_source != "none")


def verify(outcomes: list[CallOutcome], taken: dict[str, list[Step]], seed: int, rate: float) -> LoadReport:
    """Check every call against the Steps taken per session (session id -> Steps) and its planned fate."""
    rep = LoadReport(calls=len(outcomes), steps=sum(map(len, taken.values())))
    by_marker = {o.spec.marker: o for o in outcomes}
    seen: dict[str, int] = Counter()

    def bad(counter: str, msg: str) -> None:
        setattr(rep, counter, getattr(rep, counter) + 1)
        if len(rep.examples) < 10:
            rep.examples.append(f"{counter}: {msg}")

    planned: Counter[str] = Counter()
    for o in outcomes:
        fault = fault_for(o.spec.marker, seed, rate)
        planned[fault or "none"] += 1
        if (fault is None) != (o.status == 200 and o.complete and o.text_ok):
            bad("client_wrong", f"{o.spec.marker} fault={fault} status={o.status} complete={o.complete}")
    rep.faults_planned = dict(planned)
    for sid, steps in taken.items():
        for step in steps:
            marker = marker_of(step.model_dump(include={"messages", "prompt", "params"}))
            o = by_marker.get(marker) if marker else None
            if o is None:
                bad("unmarked", f"step {step.id} in {sid} has no known marker")
                continue
            seen[marker] += 1  # type: ignore[index]
            if seen[marker] > 1:  # type: ignore[index]
                bad("duplicated", f"{marker} has {seen[marker]} steps")  # type: ignore[index]
                continue
            if o.spec.session != sid:
                bad("misattributed", f"{marker} of {o.spec.session} taken from {sid}")
                continue
            fault = fault_for(marker, seed, rate)  # type: ignore[arg-type]
            if fault is not None and step.error is None:
                bad("fault_not_errored", f"{marker} ({fault}) recorded as a clean step")
            elif fault is None and step.error is not None:
                bad("clean_errored", f"{marker}: {step.error[:160]}")
            elif fault is None and not _tokens_ok(o.spec, step):
                bad("tokens_wrong", f"{marker} ({o.spec.kind}, stream={o.spec.stream}): ids/logprobs/text differ")
    for marker, o in by_marker.items():
        if marker not in seen:
            bad("lost", f"{marker} ({o.spec.kind}, stream={o.spec.stream}, status {o.status}) has no step")
    return rep
