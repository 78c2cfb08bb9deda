"""Episodes whose history outgrows the model's context end `context_exceeded`, never `error`.

Against the real policy server (`tiny-random` served with a small context, so a multi-turn episode fills it in a
few turns): (a) an agent that does not catch the server's refusal crashes on it, and the engine gives the episode
its own reason with the turn it reached, keeping the steps before it; (b) the FrozenLake agent ends the episode
itself; `rllm eval` counts them in its summary. Plus the message recognition for other servers' wording.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.io import read_jsonl
from rllm_core.types import Episode, Task
from rllm_envs.benchmarks import get_benchmark
from rllm_envs.eval.summary import print_summary, summarize
from rllm_rollout.chat import chat, make_client
from rllm_rollout.engine import (
    CONTEXT_EXCEEDED,
    context_exceeded_message,
    is_context_exceeded,
    mark_context_exceeded,
    run_episodes,
)
from rllm_rollout.rollout import RolloutConfig, rollout

CONTEXT = 320
"""Tokens of context the test server allows: the FrozenLake intro (~150 with the chat template) fits, a few turns
of 24-token replies and re-prompts later it does not."""
SAMPLING = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(scope="module")
def small_server() -> Iterator[Any]:
    """tiny-random served with a CONTEXT-token context (the server reads it from max_position_embeddings)."""
    from rllm_serve import start_policy_server
    from rllm_serve.models import load_model

    loaded = load_model("tiny-random")
    loaded.model.config.max_position_embeddings = CONTEXT
    assert loaded.context_length == CONTEXT
    server = start_policy_server(loaded, max_batch_size=8)
    try:
        yield server
    finally:
        server.stop()


@rollout(name="chatter")
async def chatter(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """A naive multi-turn agent: keeps talking and never handles errors (the server's refusal escapes it)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task.instruction)}]
    async with make_client(config) as client:
        for _ in range(50):
            reply = await chat(client, config, messages)
            messages += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "Go on."}]
    return {"answer": "never reached"}


def test_an_agent_crashing_on_the_refusal_ends_context_exceeded(small_server: Any) -> None:
    bench = get_benchmark("gsm8k")
    tasks = [Task(id="gsm8k:test:0", instruction="Count slowly from one to a thousand.", ground_truth="1000",
                  benchmark="gsm8k")]
    eps = asyncio.run(run_episodes(chatter, tasks, base_url=small_server.base_url, model=small_server.model_name,
                                   sampling=SAMPLING, benchmark=bench, progress=False))
    (ep,) = eps
    assert ep.error is None and ep.termination_reason == CONTEXT_EXCEEDED
    assert ep.reward_reason == "context_exceeded" and ep.reward == 0.0 and ep.is_correct is False
    ok = [s for s in ep.steps if s.error is None]
    assert len(ok) >= 2, "the turns before the refusal are kept"
    assert all(s.trainable for s in ok)
    assert ep.artifacts["context_exceeded_at_turn"] == len(ok) + 1
    assert f"context length of {CONTEXT}" in ep.artifacts["context_exceeded_message"]
    # the refused call itself is recorded by the gateway, with the server's message
    assert ep.steps[-1].error is not None and "HTTP 400" in ep.steps[-1].error
    # written and read back like any episode
    again = Episode.model_validate_json(ep.model_dump_json())
    assert again.termination_reason == ep.termination_reason and again.reward_reason == "context_exceeded"


def test_frozenlake_agent_ends_cleanly_with_the_turn_reached(small_server: Any) -> None:
    bench = get_benchmark("frozenlake")
    tasks = bench.load("test", max_examples=2)
    eps = asyncio.run(run_episodes(bench.default_rollout(), tasks, base_url=small_server.base_url,
                                   model=small_server.model_name, sampling=SAMPLING, benchmark=bench,
                                   progress=False))
    for ep in eps:
        art = ep.artifacts
        assert ep.error is None and art["outcome"] == "context_exceeded", art
        assert ep.reward_reason == "context_exceeded" and ep.termination_reason == CONTEXT_EXCEEDED
        ok = [s for s in ep.steps if s.error is None]
        assert art["context_exceeded_at_turn"] == art["turns"] + 1 == len(ok) + 1
        assert 1 < art["context_exceeded_at_turn"] < tasks[0].metadata["max_turns"]
        assert "context length" in art["context_exceeded_message"]


def test_rllm_eval_counts_context_exceeded_apart_from_errors(small_server: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    res = CliRunner().invoke(build_app(), [
        "eval", "frozenlake", "--max-examples", "2", "--base-url", small_server.base_url, "--output", str(out),
        "--no-progress"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "frozenlake's recommended eval settings: max_tokens=24" in res.output
    assert "context exceeded" in res.output and "failed" not in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reasons"] == {"context_exceeded": 2} and summary["context_exceeded"] == 2
    assert summary["errors"] == 0 and summary["first_error"] is None
    assert summary["terminations"] == {CONTEXT_EXCEEDED: 2}
    assert summary["config"]["benchmark_defaults"] == {"max_tokens": 24}
    rows = read_jsonl(out / "episodes.jsonl")
    assert [r.artifacts["outcome"] for r in rows] == ["context_exceeded"] * 2  # read back, validated
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["episode/context_exceeded"] == 2 and metrics[-1]["reason/context_exceeded"] == 1.0


# ------------------------------------------------------------------------------------------------ the wording
@pytest.mark.parametrize("message", [
    "the prompt has 400 tokens and max_tokens is 24: 424 is over the model's context length of 320; shorten the "
    "prompt or lower max_tokens",  # rllm's policy server
    "the prompt has 330 tokens, which leaves no room in the model's context length of 320; shorten the prompt",
    "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (1588 in the messages, "
    "512 in the completion). Please reduce the length of the messages or completion.",  # vLLM 0.x
    "'max_tokens' or 'max_completion_tokens' is too large: 512. This model's maximum context length is 2048 tokens "
    "and your request has 1600 input tokens (512 > 2048 - 1600).",  # vLLM 0.10
    "The decoder prompt (length 2100) is longer than the maximum model length of 2048. Make sure that "
    "`max_model_len` is no smaller than the number of text tokens.",  # vLLM v1
    "the request exceeds the available context size, try increasing it",  # llama.cpp
    "The input (2100 tokens) is longer than the model's context length (2048 tokens).",  # SGLang
    "prompt is too long: 210000 tokens > 200000 maximum",  # Anthropic
])
def test_servers_wordings_are_recognised(message: str) -> None:
    assert is_context_exceeded(message)
    exc = openai.BadRequestError(message, response=_response(400), body={"error": {"message": message}})
    assert context_exceeded_message(exc) == message


@pytest.mark.parametrize(("status", "message"), [
    (400, "the chat template of 'fake' does not support tools"),
    (500, "the model's context length of 2048 could not be read"),  # a server bug, not a refusal
    (404, "model 'x' is not served here"),
])
def test_other_errors_are_not_context_exceeded(status: int, message: str) -> None:
    exc = openai.APIStatusError(message, response=_response(status), body={"error": {"message": message}})
    assert context_exceeded_message(exc) is None


def test_openai_code_alone_is_enough_and_other_crashes_stay_errors() -> None:
    body = {"error": {"message": "Please shorten your messages.", "code": "context_length_exceeded"}}
    assert context_exceeded_message(openai.BadRequestError("x", response=_response(400), body=body))
    task = Task(id="t", instruction="x")
    crash = Episode(task=task, termination_reason="error",
                    error="Traceback (most recent call last):\n  ...\nRuntimeError: context length unknown\n")
    assert not mark_context_exceeded(crash) and crash.error is not None and crash.termination_reason == "error"
    done = Episode(task=task, termination_reason="completed", artifacts={"answer": "4"})
    assert not mark_context_exceeded(done) and done.termination_reason == "completed"
    ended = Episode(task=task, termination_reason="completed", artifacts={"context_exceeded_at_turn": 3})
    assert mark_context_exceeded(ended) and mark_context_exceeded(ended)  # idempotent
    assert ended.termination_reason == CONTEXT_EXCEEDED


def test_summary_counts_and_prints_context_exceeded() -> None:
    from rich.console import Console

    task = Task(id="t", instruction="x")
    eps = [Episode(task=task, termination_reason="completed", reward=0.0, reward_reason="context_exceeded",
                   is_correct=False, artifacts={"context_exceeded_at_turn": 4}),
           Episode(task=task, attempt=1, termination_reason="error", error="RuntimeError: boom", reward=0.0,
                   reward_reason="error", is_correct=False)]
    s = summarize(eps, benchmark="b", split="test", model="m", attempts=2, wall_time_s=1.0)
    assert s.reasons == {"context_exceeded": 1, "error": 1} and s.context_exceeded == 1 and s.errors == 1
    console = Console(record=True, width=120)
    print_summary(s, console)
    text = console.export_text()
    assert "context exceeded" in text and "1 of 2 episodes" in text and "1 of 2 episodes failed" in text


def _response(status: int) -> Any:
    import httpx

    return httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))
