"""Per-token policy versions recorded end to end: rllm's policy server tags each token with the version that
sampled it (`token_policy_versions` in a body, `policy_version` on each stream chunk); a Step keeps them, and a
trajectory's row takes the oldest, so an asynchronous trainer sees how stale a resumed completion is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rllm_core.types import Step, Trajectory
from rllm_rollout.capture import CallAssembler, prepare_call
from rllm_train.packing import pack_trajectory

PROMPT = [1, 2, 3]


def _call(stream: bool, wants_ids: bool = True) -> Any:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                            "stream": stream}
    if wants_ids:
        body["return_token_ids"] = True
    return prepare_call(json.dumps(body).encode(), "chat", upstream="u", inject=True)[0]


def _chunk(content: str, ids: list[int], version: Any, **top: Any) -> bytes:
    ch = {"index": 0, "delta": {"content": content}, "finish_reason": None, "token_ids": ids,
          "logprobs": {"content": [{"token": content, "logprob": -1.0, "top_logprobs": []} for _ in ids]}}
    return b"data: " + json.dumps({"id": "c1", "choices": [ch], "policy_version": version, **top}).encode() + b"\n\n"


def _stream(versions: list[Any]) -> list[bytes]:
    first = b"data: " + json.dumps({"id": "c1", "choices": [], "policy_version": versions[0],
                                    "prompt_token_ids": PROMPT}).encode() + b"\n\n"
    tokens = [_chunk(f"t{i}", [10 + i], v) for i, v in enumerate(versions)]
    end = b"data: " + json.dumps({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                                  "policy_version": versions[-1]}).encode() + b"\n\ndata: [DONE]\n\n"
    return [first, *tokens, end]


def _steps(asm: CallAssembler, pieces: list[bytes]) -> tuple[bytes, list[Step]]:
    out = b"".join(asm.feed(p) for p in pieces)
    tail, steps = asm.finish()
    return out + tail, steps


def test_a_stream_resumed_across_a_swap_records_each_tokens_version_and_the_row_takes_the_oldest() -> None:
    _, (step,) = _steps(CallAssembler(_call(True), sse=True), _stream([3, 3, 4, 4]))
    assert step.completion_token_ids == [10, 11, 12, 13] and step.token_source == "server"
    assert step.token_policy_versions == [3, 3, 4, 4] and step.policy_version == 4
    row = pack_trajectory(Trajectory(steps=[step]), advantage=1.0)[0][0]
    assert row.policy_version == 3


def test_a_body_gives_its_per_token_list_and_the_client_that_did_not_ask_never_sees_it() -> None:
    body = {"id": "c2", "policy_version": 5, "prompt_token_ids": PROMPT, "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "ab"}, "finish_reason": "stop",
        "token_ids": [7, 8], "token_policy_versions": [5, 6],
        "logprobs": {"content": [{"token": t, "logprob": -0.5, "top_logprobs": []} for t in "ab"]}}]}
    raw = json.dumps(body).encode()
    _, (step,) = _steps(CallAssembler(_call(False), sse=False), [raw])
    assert step.token_policy_versions == [5, 6]
    sent, (same,) = _steps(CallAssembler(_call(False, wants_ids=False), sse=False), [raw])
    choice = json.loads(sent)["choices"][0]
    assert "token_ids" not in choice and "token_policy_versions" not in choice
    assert same.token_policy_versions == [5, 6]  # recorded all the same


@pytest.mark.parametrize("versions", [[3, None, 4], [3, "x", 4], [3, True, 4]])
def test_a_chunk_without_a_usable_version_leaves_the_steps_versions_unknown(versions: list[Any]) -> None:
    _, (step,) = _steps(CallAssembler(_call(True), sse=True), _stream(versions))
    assert step.token_policy_versions is None and step.completion_token_ids == [10, 11, 12]


def test_a_step_refuses_versions_that_do_not_match_its_tokens() -> None:
    with pytest.raises(ValueError, match="2 token policy versions for 3 completion tokens"):
        Step(completion_token_ids=[1, 2, 3], token_policy_versions=[0, 0])
    with pytest.raises(ValueError, match="1 token policy versions for 0 completion tokens"):
        Step(token_policy_versions=[0])
