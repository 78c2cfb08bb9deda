"""The streams and checks the capture property tests share (imported by them; no tests of its own).

Streams recorded from rllm's policy server (`tiny-random`: n=2 interleaved, completions) and the fake upstream
(n=3, a tool call, completions; Responses API: text with logprobs, a function call) in tests/data/streams/,
and generated ones (unicode, tool-call fragments without `index`), each re-framed per event (LF, CRLF, bare CR,
`data:` with/without space, multi-line data, comments,
`event:` lines, raw UTF-8), given nulls / missing fields, and cut anywhere (inside UTF-8 characters and CRLF).
`parse_sse` is an independent, spec-following reader: what a client sees, to compare the assembler against.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rllm_core.types import Step
from rllm_rollout.capture import CallAssembler, prepare_call
from rllm_rollout.capture.assemblers import make_assembler

STREAMS = {p.stem: p.read_bytes() for p in sorted((Path(__file__).parent / "data" / "streams").glob("*.sse"))}
MSGS = [{"role": "user", "content": "hi"}]
EXPLORE = os.environ.get("RLLM_HYPOTHESIS_EXPLORE") == "1"
"""Off (CI, the default): the same examples every run, so CI judges the change, not the draw. On: new random examples
each run (and more of them), for hunting — run `RLLM_HYPOTHESIS_EXPLORE=1 pytest tests/test_capture_properties*.py`."""
FAST = settings(max_examples=1000 if EXPLORE else 250, deadline=None, derandomize=not EXPLORE,
                suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=300 if EXPLORE else 80, deadline=None, derandomize=not EXPLORE,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TEXT = st.text(st.sampled_from("ab é→ü🌍\u2028日\"\\\n"), max_size=6)


# ---------------------------------------------------------------------------------- a spec-following SSE reader
def parse_sse(raw: bytes) -> list[tuple[str | None, Any]]:
    """Events as a client following the SSE spec sees them: (event type, data parsed as JSON when it is)."""
    lines = re.split(r"\r\n|\r|\n", raw.decode("utf-8"))[:-1]  # the last piece is not a complete line
    events, data, name = [], [], None
    for line in lines:
        if line == "":
            if data:
                text = "\n".join(data)
                try:
                    events.append((name, json.loads(text)))
                except ValueError:
                    events.append((name, text))
            data, name = [], None
        elif not line.startswith(":"):
            key, sep, value = line.partition(":")
            value = value[1:] if sep and value.startswith(" ") else value
            if key == "data":
                data.append(value)
            elif key == "event":
                name = value
    return events


def items_of(raw: bytes) -> list[Any]:
    """A recorded stream as its payloads (dicts, and "[DONE]")."""
    return [data.strip() if isinstance(data, str) else data for _, data in parse_sse(raw)]


# ---------------------------------------------------------------------------------- rendering and chunking
EOLS = ["\n", "\r\n", "\r"]


@st.composite
def rendered(draw: st.DrawFn, items: list[Any]) -> tuple[bytes, list[int]]:
    """The items as SSE bytes, each event framed its own way; and where each item's event starts."""
    out, starts = b"", []
    for item in items:
        eol = draw(st.sampled_from(EOLS))
        end = draw(st.sampled_from(["\r", "\r\n"] if eol == "\r" else EOLS))  # "\r"+"\n" would be one line end
        if draw(st.integers(0, 9)) == 0:
            out += f": ping{eol}{end}".encode()  # a keep-alive comment on its own
        starts.append(len(out))
        if isinstance(item, str):
            text = item
        else:
            text = json.dumps(item, ensure_ascii=draw(st.booleans()), indent=1 if draw(st.booleans()) else None)
        prefix = "data: " if draw(st.booleans()) else "data:"
        lines = [prefix + ln for ln in text.split("\n")]
        if isinstance(item, dict) and isinstance(item.get("type"), str) and draw(st.booleans()):
            lines.insert(0, "event: " + item["type"].replace("\n", " ").replace("\r", " "))  # Responses names
        elif draw(st.integers(0, 5)) == 0:
            lines.insert(0, "event: message" if draw(st.booleans()) else ": note")
        out += (eol.join(lines) + eol + end).encode()
    return out, starts


@st.composite
def cut(draw: st.DrawFn, raw: bytes) -> list[bytes]:
    """`raw` in pieces, split anywhere: often inside a UTF-8 character or between \\r and \\n."""
    tricky = [i for i in range(1, len(raw)) if (raw[i] & 0xC0) == 0x80 or raw[i - 1:i + 1] == b"\r\n"]
    anywhere = st.integers(0, len(raw))
    points = draw(st.lists(st.one_of(anywhere, st.sampled_from(tricky)) if tricky else anywhere, max_size=30))
    bounds = [0, *sorted(points), len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(bounds)]


# ---------------------------------------------------------------------------------- nulls and missing fields
NULLS = ["logprobs", "content", "logprob", "delta", "choices", "token_ids", "drop_logprobs", "drop_token_ids"]


def mutate(items: list[Any], edits: list[tuple[int, int, str]]) -> list[Any]:
    """Put a null (or take a field away) where vLLM / OpenAI-compatible servers have been seen to."""
    items = copy.deepcopy(items)
    chunks = [c for c in items if isinstance(c, dict)]
    for i, j, kind in edits:
        chunk = chunks[i % len(chunks)]
        choices = chunk.get("choices") or [{}]
        ch = choices[j % len(choices)]
        if kind == "choices":
            chunk["choices"] = None
        elif kind in ("logprobs", "token_ids", "delta"):
            ch[kind] = None
        elif kind.startswith("drop_"):
            ch.pop(kind[5:], None)
        elif kind == "content" and isinstance(ch.get("delta"), dict):
            ch["delta"]["content"] = None
        elif kind == "content" and "text" in ch:
            ch["text"] = None
        elif kind == "logprob" and isinstance(ch.get("logprobs"), dict):
            entries, values = ch["logprobs"].get("content"), ch["logprobs"].get("token_logprobs")
            if entries:
                entries[0]["logprob"] = None
            if values:
                values[0] = None
    return items


def expected(items: list[Any]) -> dict[int, dict[str, Any]]:
    """Per choice index: the text deltas, the ids, whether the logprobs cover every id (a plain reading)."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in items:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            continue
        for pos, ch in enumerate(chunk["choices"]):
            e = out.setdefault(ch["index"] if isinstance(ch.get("index"), int) else pos,
                               {"text": [], "ids": None, "lps": [], "complete": True, "tools": False})
            delta = ch.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else ch.get("text")
            if isinstance(piece, str) and piece:
                e["text"].append(piece)
            frags = delta.get("tool_calls") if isinstance(delta, dict) else None
            e["tools"] |= isinstance(frags, list) and any(isinstance(f, dict) for f in frags)
            ids = ch.get("token_ids") if isinstance(ch.get("token_ids"), list) else None
            lp = ch.get("logprobs") if isinstance(ch.get("logprobs"), dict) else {}
            vals = ([x.get("logprob") for x in lp["content"]] if isinstance(lp.get("content"), list)
                    else lp.get("token_logprobs") if isinstance(lp.get("token_logprobs"), list) else [])
            if ids is not None:
                e["ids"] = (e["ids"] or []) + ids
            e["lps"] += vals
            e["complete"] &= len(vals) == len(ids or []) and None not in vals
    return out


def stripped(events: list[tuple[str | None, Any]], wants_lp: bool, wants_ids: bool) -> list[tuple[str | None, Any]]:
    """The events minus exactly the fields capture injects when the client did not ask for them."""
    events = copy.deepcopy(events)
    for _, data in events:
        if not isinstance(data, dict):
            continue
        if not wants_ids:
            data.pop("prompt_token_ids", None)
        for ch in data.get("choices") if isinstance(data.get("choices"), list) else []:
            if isinstance(ch, dict):
                if not wants_lp:
                    ch.pop("logprobs", None)
                if not wants_ids:
                    ch.pop("token_ids", None)
                    ch.pop("prompt_token_ids", None)
    return events


# ---------------------------------------------------------------------------------- the Responses API
LOGPROBS = "message.output_text.logprobs"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
RNULLS = ["delta", "logprobs", "drop_logprobs", "entry_logprob", "output", "output_messages", "usage", "response"]
"""Nulls in a Responses stream: in delta events (`delta`, `logprobs`, an entry's `logprob`), in the final
response (`output`, `output_messages`, `usage`), or a start event's `response` (an unknown kind is skipped)."""


def mutate_responses(items: list[Any], edits: list[tuple[int, int, str]]) -> list[Any]:
    items = copy.deepcopy(items)
    events = [e for e in items if isinstance(e, dict)]
    deltas = [e for e in events if str(e.get("type")).endswith(".delta")]
    final = next(e["response"] for e in reversed(events) if e.get("type") in TERMINAL)
    for i, j, kind in edits:
        ev = deltas[i % len(deltas)]
        if kind in ("delta", "logprobs"):
            ev[kind] = None
        elif kind == "drop_logprobs":
            ev.pop("logprobs", None)
        elif kind == "entry_logprob" and ev.get("logprobs"):
            ev["logprobs"][j % len(ev["logprobs"])]["logprob"] = None
        elif kind in ("output", "output_messages", "usage"):
            final[kind] = None
        elif kind == "response":
            events[0]["response"] = None  # response.created's
    return items


def expected_responses(items: list[Any]) -> dict[str, Any]:
    """A plain reading of a Responses stream: its final response's output (else the items as they were done)
    and raw token messages; and the text / argument deltas as they streamed."""
    events = [e for e in items if isinstance(e, dict)]
    final = next((e["response"] for e in reversed(events) if e.get("type") in TERMINAL
                  and isinstance(e.get("response"), dict)), {})
    output = final.get("output") or [e["item"] for e in events if e.get("type") == "response.output_item.done"]
    texts = [p["text"] for it in output if it.get("type") == "message" for p in it["content"]
             if p.get("type") == "output_text"]
    tools = [(it["name"], it["arguments"]) for it in output if it.get("type") == "function_call"]
    raw = final.get("output_messages")
    ids = raw[0]["tokens"] if isinstance(raw, list) else None
    return {"text": "".join(texts) if texts else (None if tools else ""), "tools": tools, "ids": ids,
            "lps": raw[0].get("logprobs") if ids else None, "done": bool(final),
            "deltas": "".join(e["delta"] for e in events if e.get("type") == "response.output_text.delta"
                              and isinstance(e.get("delta"), str)),
            "args": "".join(e["delta"] for e in events if e.get("type") ==
                            "response.function_call_arguments.delta" and isinstance(e.get("delta"), str))}


def check_responses_step(steps: list[Step], items: list[Any]) -> None:
    want = expected_responses(items)
    [step] = steps  # (d) one Step: a Responses call has one output
    assert step.endpoint == "responses" and step.choice_index == 0 and step.error is None
    assert step.text == want["text"]
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in step.tool_calls or []] == want["tools"]
    assert step.completion_token_ids == want["ids"]
    if want["ids"] is not None and want["lps"] is not None and len(want["lps"]) == len(want["ids"]):
        assert step.logprobs == want["lps"] and step.trainable
    else:
        assert step.logprobs is None and not step.trainable


def stripped_responses(events: list[tuple[str | None, Any]], wants_lp: bool,
                       wants_ids: bool) -> list[tuple[str | None, Any]]:
    """The events with what capture asked for put back as the server says it unasked: a text event's
    `logprobs` `[]`, an output_text part's `null`, `top_logprobs` `null`; raw token messages `null`."""
    events = copy.deepcopy(events)

    def part(p: Any) -> None:
        if isinstance(p, dict) and p.get("type") == "output_text" and "logprobs" in p and not wants_lp:
            p["logprobs"] = None

    def item(it: Any) -> None:
        if isinstance(it, dict) and it.get("type") == "message" and isinstance(it.get("content"), list):
            for p in it["content"]:
                part(p)

    def response(r: dict[str, Any]) -> None:
        for key in ("input_messages", "output_messages") if not wants_ids else ():
            if key in r:
                r[key] = None
        if not wants_lp:
            if "top_logprobs" in r:
                r["top_logprobs"] = None
            for it in r["output"] if isinstance(r.get("output"), list) else []:
                item(it)

    for _, data in events:
        if not isinstance(data, dict):
            continue
        if data.get("type") in ("response.output_text.delta", "response.output_text.done") and "logprobs" in data \
                and not wants_lp:
            data["logprobs"] = []
        for key, fix in (("response", response), ("item", item), ("part", part)):
            if isinstance(data.get(key), dict):
                fix(data[key])
        if "output" in data:
            response(data)
    return events


# ---------------------------------------------------------------------------------- generated streams
@st.composite
def generated(draw: st.DrawFn) -> tuple[str, list[Any], list[list[tuple[str, str]]]]:
    """(endpoint, payloads, per choice the tool calls it makes): n choices interleaved, one or several per chunk,
    chat tool-call fragments with or without `index` (without: a new call starts with a new id)."""
    endpoint = draw(st.sampled_from(["chat", "completions"]))
    n = draw(st.integers(1, 3))
    indexed = n > 1 or draw(st.booleans())
    tools_indexed = draw(st.booleans())
    deltas: list[tuple[int, dict[str, Any]]] = []
    calls: list[list[tuple[str, str]]] = []
    for i in range(n):
        mine: list[dict[str, Any]] = []
        calls.append([])
        if endpoint == "chat" and draw(st.booleans()):
            for k in range(draw(st.integers(1, 2))):
                pieces = draw(st.lists(TEXT, min_size=1, max_size=3))
                calls[i].append((f"f{k}", "".join(pieces)))
                for m, piece in enumerate(pieces):
                    frag: dict[str, Any] = {"function": {"arguments": piece}}
                    if m == 0:
                        frag.update(id=f"call_{i}_{k}", type="function")
                        frag["function"]["name"] = f"f{k}"
                    if tools_indexed:
                        frag["index"] = k
                    mine.append({"delta": {"tool_calls": [frag]}})
        for text in draw(st.lists(TEXT, max_size=4)):
            ids = draw(st.lists(st.integers(0, 50000), min_size=1, max_size=3))
            body = {"delta": {"content": text}} if endpoint == "chat" else {"text": text}
            lps = [-float(t % 97) / 10 for t in ids]
            body["logprobs"] = ({"content": [{"token": "t", "logprob": v} for v in lps]} if endpoint == "chat"
                                else {"tokens": ["t"] * len(ids), "token_logprobs": lps})
            mine.append({**body, "token_ids": ids})
        deltas += [(i, d) for d in mine]
    first = {"id": "r", "prompt_token_ids": [1, 2], "choices": [
        {"index": i, "delta": {"role": "assistant", "content": ""}} if endpoint == "chat" else
        {"index": i, "text": ""} for i in range(n)]}
    items: list[Any] = [first]
    queues = {i: [d for j, d in deltas if j == i] for i in range(n)}
    while live := [i for i in range(n) if queues[i]]:  # interleave the choices, each one's deltas in order
        i = draw(st.sampled_from(live))
        group = [i] + [j for j in live if j != i and draw(st.booleans())]
        items.append({"id": "r", "choices": [{**({"index": j} if indexed else {}), **queues[j].pop(0)}
                                              for j in group]})
    finish = "tool_calls" if any(calls) else "stop"
    items.append({"id": "r", "choices": [{"index": i, "finish_reason": finish} for i in range(n)]})
    return endpoint, [*items, "[DONE]"], calls


def call_for(endpoint: str, wants_lp: bool, wants_ids: bool) -> Any:
    if endpoint == "responses":  # asked for in vLLM's Responses fields (what the recorded streams were sent)
        body: dict[str, Any] = {"model": "fake", "input": "say hi", "stream": True}
        if wants_lp:
            body.update(include=[LOGPROBS], top_logprobs=0)
        if wants_ids:
            body["enable_response_messages"] = True
        return prepare_call(json.dumps(body).encode(), endpoint, upstream="u", inject=True)[0]
    body = {"model": "m", "stream": True}
    body.update(messages=MSGS) if endpoint == "chat" else body.update(prompt="p")
    if wants_lp:
        body["logprobs"] = True
    if wants_ids:
        body["return_token_ids"] = True
    return prepare_call(json.dumps(body).encode(), endpoint, upstream="u", inject=True)[0]


def run(asm: CallAssembler, pieces: list[bytes]) -> tuple[bytes, list[Step]]:
    out = b"".join(asm.feed(p) for p in pieces)
    tail, steps = asm.finish()
    return out + tail, steps


def assembler(endpoint: str, asks: tuple[bool, bool], sse: bool = True) -> CallAssembler:
    return make_assembler(call_for(endpoint, *asks), sse=sse)  # what both transports pick for the endpoint


def check_client_bytes(raw: bytes, got: bytes, wants_lp: bool, wants_ids: bool, endpoint: str = "chat") -> None:
    if wants_lp and wants_ids:
        assert got == raw  # (a) nothing stripped: byte for byte
    else:
        strip = stripped_responses if endpoint == "responses" else stripped
        assert parse_sse(got) == strip(parse_sse(raw), wants_lp, wants_ids)  # (b)


def check_steps(steps: list[Step], items: list[Any], calls: list[list[tuple[str, str]]] | None = None,
                endpoint: str = "chat") -> None:
    if endpoint == "responses":
        return check_responses_step(steps, items)
    want = expected(items)
    if not want:  # every choice nulled out: the call is still one Step, an errored one (never silently lost)
        assert len(steps) == 1 and steps[0].error and not steps[0].trainable, steps
        return
    assert [s.choice_index for s in steps] == sorted(want)  # (d) exactly one Step per choice
    for step in steps:
        e = want[step.choice_index]
        tools = calls[step.choice_index] if calls else None
        assert step.text == ("".join(e["text"]) if e["text"] else (None if e["tools"] else ""))
        assert step.completion_token_ids == e["ids"]
        if e["complete"] and e["ids"] is not None:
            assert step.logprobs == e["lps"] and step.error is None and step.trainable
            assert "logprobs_incomplete" not in step.metadata
        else:
            assert step.logprobs is None and not step.trainable
            if e["ids"]:
                assert step.metadata["logprobs_incomplete"]
        if tools:
            assert [(t["function"]["name"], t["function"]["arguments"]) for t in step.tool_calls or []] == tools


def endpoint_of_stream(name: str) -> str:
    return "responses" if "responses" in name else "completions" if "completions" in name else "chat"


def source(responses: bool = True) -> st.SearchStrategy[tuple[str, list[Any], list[list[tuple[str, str]]] | None]]:
    names = [n for n in sorted(STREAMS) if responses or endpoint_of_stream(n) != "responses"]
    recorded = st.sampled_from(names).map(lambda name: (endpoint_of_stream(name), items_of(STREAMS[name]), None))
    return st.one_of(recorded, generated())


ASKS = st.tuples(st.booleans(), st.booleans())
EDITS = st.lists(st.tuples(st.integers(0, 99), st.integers(0, 3), st.sampled_from(NULLS + RNULLS)), max_size=4)


# ---------------------------------------------------------------------------------- an odd stream the issue named
ODD = (b'data: {"id":"r","prompt_token_ids":[1],"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
       b'\r\r: ping\r\r'
       b'data:{"choices":[{"index":0,"delta":{"content":"h\xc3\xa9"},"token_ids":[5,6],'
       b'"logprobs":{"content":[{"token":"h","logprob":-1.0},{"token":"\xc3\xa9","logprob":null}]}}]}\n\n'
       b'data: {"choices":[{"index":0,"delta":null,"token_ids":[7],"logprobs":null}]}\r\n\r\n'
       b'data: {"choices":[{"index":0,"delta":{"content":"!"},"token_ids":[8],"logprobs":{"content":[{"token":"!",'
       b'"logprob":-2.0}]},"finish_reason":"stop"}],"usage":null}\n\ndata: {"choices":null}\n\ndata: [DONE]\n\n')

