"""Capture never breaks a call: the assembler on its own, proven with Hypothesis over real and generated streams
(see test_capture_properties_support.py for how they are framed, mutated and cut).

Properties: (a) nothing stripped → the client gets the upstream's bytes exactly; (b) stripped → the client's
events parse to the upstream's minus exactly the injected fields; (c) feed/finish never raise, even when a hook
(or a subclass's) does, and then the client still gets the upstream's bytes from that event on; (d) one Step
per choice, its text the concatenated deltas, logprobs kept only when they cover the ids (else marked).
The same through the real transports: test_capture_properties_transports.py. Run with
--hypothesis-show-statistics for the counts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_capture_properties_support import (
    ASKS,
    EDITS,
    FAST,
    ODD,
    STREAMS,
    TEXT,
    assembler,
    call_for,
    check_client_bytes,
    check_steps,
    cut,
    expected,
    expected_responses,
    items_of,
    mutate,
    mutate_responses,
    parse_sse,
    rendered,
    run,
    source,
    stripped,
)

from rllm_core.types import Step
from rllm_rollout.capture import CallAssembler


# ---------------------------------------------------------------------------------- the assembler on its own
@FAST
@given(data=st.data(), src=source(), asks=ASKS, edits=EDITS)
def test_any_framing_chunking_and_nulls(data: st.DataObject, src: Any, asks: tuple[bool, bool], edits: Any):
    endpoint, items, calls = src
    items = (mutate_responses if endpoint == "responses" else mutate)(items, edits)
    raw, _ = data.draw(rendered(items))
    asm = assembler(endpoint, asks)
    got, steps = run(asm, data.draw(cut(raw)))
    assert asm._failed is None  # nulls and junk are handled by the parser, not by the safety net
    assert asm.done  # [DONE], or (Responses) response.completed
    check_client_bytes(raw, got, *asks, endpoint=endpoint)
    check_steps(steps, items, None if edits else calls, endpoint=endpoint)


@pytest.mark.parametrize("name", ["fake_responses_text", "fake_responses_tool_call"])
def test_a_recorded_responses_stream_is_one_step_of_its_deltas(name: str):
    items = items_of(STREAMS[name])
    assert "[DONE]" not in items and items[-1]["type"] == "response.completed"
    want = expected_responses(items)
    [step] = run(assembler("responses", (False, False)), [STREAMS[name]])[1]
    assert step.text == (want["deltas"] if "text" in name else None) and (want["args"] or "text" in name)
    assert [t["function"]["arguments"] for t in step.tool_calls or []] == ([want["args"]] if want["args"] else [])
    assert step.trainable and step.error is None and len(step.logprobs or []) == len(want["ids"])


class Exploding(CallAssembler):
    """A subclass whose hook raises at its `at`-th call: the base class's safety must cover it."""

    def __init__(self, call: Any, hook: str, at: int) -> None:
        super().__init__(call, sse=True)
        self.hook, self.at, self.calls = hook, at, 0

    def _boom(self, hook: str) -> None:
        self.calls += hook == self.hook
        if hook == self.hook and self.calls == self.at:
            raise RuntimeError("boom")

    def _absorb_chunk(self, chunk: dict[str, Any]) -> None:
        self._boom("absorb")
        super()._absorb_chunk(chunk)

    def _strip(self, obj: dict[str, Any]) -> None:
        self._boom("strip")
        super()._strip(obj)

    def _step(self, *args: Any) -> Step:
        self._boom("step")
        return super()._step(*args)

    def _steps(self, error: str | None) -> list[Step]:
        self._boom("steps")
        return super()._steps(error)


@FAST
@given(data=st.data(), src=source(responses=False), asks=ASKS,  # (Responses: the transports file's hook test)
       hook=st.sampled_from(["absorb", "strip", "step", "steps"]), at=st.integers(1, 12))
def test_a_raising_hook_degrades_to_pass_through(data: st.DataObject, src: Any, asks: tuple[bool, bool],
                                                 hook: str, at: int):
    endpoint, items, _ = src
    raw, starts = data.draw(rendered(items))
    asm = Exploding(call_for(endpoint, *asks), hook, at)
    got, steps = run(asm, data.draw(cut(raw)))  # (c) never raises
    assert asm.done == ("[DONE]" in items)  # seen in pass-through too: the Step is recorded before the client gets it
    chunk_pos = [k for k, it in enumerate(items) if isinstance(it, dict)]
    strips = not all(asks)
    broke = hook in ("absorb", "strip") and at <= len(chunk_pos) and (hook == "absorb" or strips)
    want = expected(items)
    if not broke:
        check_client_bytes(raw, got, *asks)
        assert [s.choice_index for s in steps] == sorted(want)
        assert [s.text or "" for s in steps] == ["".join(e["text"]) for _, e in sorted(want.items())]
        failed = {s.choice_index for s in steps if s.error}  # a failing _step costs its choice, _steps all
        assert failed == ({sorted(want)[at - 1]} if hook == "step" and at <= len(want) else
                          set(want) if hook == "steps" and at == 1 else set())
        return
    k = chunk_pos[at - 1]  # the item whose hook raised: from its event on, the upstream's bytes as they came
    rest = raw[starts[k]:]
    assert got.endswith(rest) and (strips or got == raw)
    if strips:
        assert parse_sse(got[:len(got) - len(rest)]) == stripped(parse_sse(raw[:starts[k]]), *asks)
    seen = expected(items[:k + (hook == "strip")])
    assert all(s.error and s.error.startswith("capture failed") for s in steps)
    assert [s.choice_index for s in steps] == (sorted(seen) or [0])
    assert [s.text or "" for s in steps] == ["".join(e["text"]) for _, e in sorted(seen.items())] or [""]


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | TEXT,
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(TEXT, kids, max_size=3), max_leaves=8)


def maybe(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(s, JSON)


CHOICE = st.fixed_dictionaries({}, optional={
    "index": maybe(st.integers(0, 3)), "text": maybe(TEXT), "finish_reason": maybe(st.just("stop")),
    "token_ids": maybe(st.lists(st.integers(0, 9), max_size=3)), "prompt_token_ids": maybe(st.just([1])),
    "delta": maybe(st.fixed_dictionaries({}, optional={"content": maybe(TEXT), "tool_calls": maybe(st.lists(
        st.fixed_dictionaries({}, optional={"index": maybe(st.integers(0, 2)), "id": maybe(TEXT),
                                            "function": maybe(st.fixed_dictionaries({}, optional={
                                                "name": maybe(TEXT), "arguments": maybe(TEXT)}))}),
        max_size=2))})),
    "logprobs": maybe(st.fixed_dictionaries({}, optional={
        "content": maybe(st.lists(st.fixed_dictionaries({}, optional={"logprob": maybe(st.floats(-5, 0)),
                                                                      "token": maybe(TEXT)}), max_size=3)),
        "token_logprobs": maybe(st.lists(maybe(st.floats(-5, 0)), max_size=3))}))})
CHUNK = st.fixed_dictionaries({}, optional={"choices": maybe(st.lists(maybe(CHOICE), max_size=3)),
                                            "usage": JSON, "policy_version": JSON, "prompt_token_ids": JSON,
                                            "id": JSON, "model": JSON, "error": JSON})
LP_ENTRIES = st.lists(maybe(st.fixed_dictionaries({}, optional={"logprob": maybe(st.floats(-5, 0)),
                                                                 "token": maybe(TEXT)})), max_size=3)
PART = st.fixed_dictionaries({}, optional={"type": maybe(st.just("output_text")), "text": maybe(TEXT),
                                           "logprobs": maybe(LP_ENTRIES)})
ITEM = st.fixed_dictionaries({}, optional={
    "type": maybe(st.sampled_from(["message", "function_call", "reasoning"])), "content": maybe(st.lists(
        maybe(PART), max_size=2)), "name": maybe(TEXT), "arguments": maybe(TEXT), "call_id": maybe(TEXT)})
RAW = st.lists(maybe(st.fixed_dictionaries({}, optional={"type": maybe(st.just("raw_message_tokens")), "tokens":
                                                          maybe(st.lists(maybe(st.integers(0, 9)), max_size=3)),
                                                          "logprobs": maybe(st.lists(JSON, max_size=3))})),
               max_size=2)
RESPONSE = st.fixed_dictionaries({}, optional={
    "status": maybe(st.sampled_from(["completed", "incomplete", "failed", "cancelled"])),
    "output": maybe(st.lists(maybe(ITEM), max_size=2)), "input_messages": maybe(RAW), "output_messages": maybe(RAW),
    "usage": JSON, "incomplete_details": JSON, "error": JSON, "top_logprobs": JSON, "policy_version": JSON})
EVENT = st.fixed_dictionaries({}, optional={
    "type": maybe(st.sampled_from(["response.created", "response.output_item.added", "response.output_item.done",
                                   "response.output_text.delta", "response.output_text.done", "response.completed",
                                   "response.function_call_arguments.delta", "response.incomplete",
                                   "response.function_call_arguments.done", "response.failed", "error"])),
    "output_index": maybe(st.integers(0, 2)), "delta": maybe(TEXT), "logprobs": maybe(LP_ENTRIES),
    "arguments": maybe(TEXT), "item": maybe(ITEM), "part": maybe(PART), "response": maybe(RESPONSE),
    "output": maybe(st.lists(maybe(ITEM), max_size=2)), "message": JSON})


@FAST
@given(data=st.data(), endpoint=st.sampled_from(["chat", "completions", "responses"]), asks=ASKS, sse=st.booleans())
def test_junk_of_every_shape_is_parsed_without_an_exception(data: st.DataObject, endpoint: str,
                                                            asks: tuple[bool, bool], sse: bool):
    shape = (EVENT if sse else RESPONSE) if endpoint == "responses" else CHUNK
    chunks = data.draw(st.lists(maybe(shape), max_size=5))
    chunks = [c if isinstance(c, dict) else json.dumps(c) for c in chunks]  # a str item is rendered as is
    items = [*chunks, "[DONE]"] if sse else chunks[:1]
    raw = data.draw(rendered(items))[0] if sse else (json.dumps(items[0]) if items and isinstance(
        items[0], dict) else (items or ["null"])[0]).encode()
    asm = assembler(endpoint, asks, sse=sse)
    got, steps = run(asm, data.draw(cut(raw)))
    assert asm._failed is None, asm._failed  # handled by the parser itself, not caught by the net
    assert steps and all(isinstance(s, Step) for s in steps)
    if all(asks):
        assert got == raw
    if sse:
        check_client_bytes(raw, got, *asks, endpoint=endpoint)


@FAST
@given(data=st.data(), asks=ASKS, sse=st.booleans())
def test_responses_junk_of_every_shape_is_parsed_without_an_exception(data: st.DataObject, asks: tuple[bool, bool],
                                                                      sse: bool):
    test_junk_of_every_shape_is_parsed_without_an_exception.hypothesis.inner_test(data, "responses", asks, sse)


@FAST
@given(raw=st.binary(max_size=300), sse=st.booleans(), asks=ASKS, data=st.data())
def test_arbitrary_bytes_never_raise(raw: bytes, sse: bool, asks: tuple[bool, bool], data: st.DataObject):
    asm = CallAssembler(call_for("chat", *asks), sse=sse)
    got, steps = run(asm, data.draw(cut(raw)))
    assert steps and (got == raw or not all(asks))



def test_null_logprobs_keep_the_step_mark_it_and_warn_once(caplog: pytest.LogCaptureFixture):
    asm = CallAssembler(call_for("chat", False, False), sse=True)
    with caplog.at_level("WARNING", logger="rllm.capture"):
        got, [step] = run(asm, [ODD[i:i + 7] for i in range(0, len(ODD), 7)])
    assert b"logprob" not in got and b"token_ids" not in got and [d for _, d in parse_sse(got)][-1] == "[DONE]"
    assert step.error is None and step.text == "hé!" and step.completion_token_ids == [5, 6, 7, 8]
    assert step.logprobs is None and not step.trainable  # the trainer skips it (counted as untrainable)
    assert step.metadata["server_logprobs_partial"] == [-1.0, None, None, -2.0]
    assert "1 null logprob" in step.metadata["logprobs_incomplete"]
    assert "1 token id(s) without logprobs" in step.metadata["logprobs_incomplete"]
    assert len([r for r in caplog.records if "logprobs do not cover" in r.getMessage()]) == 1

