"""The decode engine and sampling without HTTP: the sampler's distribution, filters, and failing sinks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from rllm_serve import load_model
from rllm_serve.engine import DecodeEngine
from rllm_serve.sampling import SamplingParams, sample_tokens, scaled_logprobs
from rllm_serve.sequence import GenerationRequest, TokenEvent

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def draw(params: SamplingParams, k: int, seed: int = 0) -> torch.Tensor:
    lp_BV = torch.log(PROBS).expand(k, -1)
    gens = [torch.Generator().manual_seed(seed + i) for i in range(k)]
    return sample_tokens(lp_BV, [params] * k, gens)


def test_sampler_follows_the_distribution() -> None:
    counts = torch.bincount(draw(SamplingParams(max_tokens=1), 4000), minlength=4).float() / 4000
    assert torch.allclose(counts, PROBS, atol=0.03)
    assert torch.equal(draw(SamplingParams(max_tokens=1), 50, seed=3), draw(SamplingParams(max_tokens=1), 50, seed=3))


def test_top_p_and_top_k_restrict_the_draw() -> None:
    assert set(draw(SamplingParams(max_tokens=1, top_p=0.6), 500).tolist()) == {0, 1}
    assert set(draw(SamplingParams(max_tokens=1, top_k=3), 500).tolist()) == {0, 1, 2}
    assert set(draw(SamplingParams(max_tokens=1, temperature=0), 50).tolist()) == {0}


def test_scaled_logprobs_use_temperature_and_treat_zero_as_one() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0]])
    lp = scaled_logprobs(logits, torch.tensor([0.5, 0.0]))
    assert torch.allclose(lp[0], torch.log_softmax(logits[0] / 0.5, -1))
    assert torch.allclose(lp[1], torch.log_softmax(logits[1], -1))


@pytest.fixture(scope="module")
def engine() -> Iterator[DecodeEngine]:
    eng = DecodeEngine(load_model("tiny-random"), threads=1).start()
    yield eng
    eng.stop()


def collect(n: int = 1) -> tuple[list[TokenEvent], threading.Event, Callable[[TokenEvent], None]]:
    events: list[TokenEvent] = []
    done = threading.Event()

    def sink(ev: TokenEvent) -> None:
        events.append(ev)
        if sum(e.finish_reason is not None for e in events) == n:
            done.set()

    return events, done, sink


def test_a_failing_sink_cancels_only_its_own_request(engine: DecodeEngine) -> None:
    def broken(ev: TokenEvent) -> None:
        raise RuntimeError("client loop closed")

    events, done, sink = collect()
    engine.submit(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=500, ignore_eos=True), broken))
    engine.submit(GenerationRequest([4, 5, 6, 7], SamplingParams(max_tokens=30, ignore_eos=True), sink))
    assert done.wait(30)
    assert [e.finish_reason for e in events if e.finish_reason] == ["length"]
    assert sum(e.token_id is not None for e in events) == 30
    deadline = time.monotonic() + 5  # the sink fires inside the step; the row leaves right after it
    while engine.running and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine.running == 0


def test_stop_token_ids_and_eos(engine: DecodeEngine) -> None:
    events, done, sink = collect()
    engine.submit(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=20, temperature=0), sink))
    assert done.wait(30)
    first = next(e.token_id for e in events if e.token_id is not None)
    events2, done2, sink2 = collect()
    engine.submit(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=20, temperature=0,
                                                             stop_token_ids=(first,)), sink2))
    assert done2.wait(30)
    assert [e.token_id for e in events2] == [first] and events2[0].finish_reason == "stop"


def test_a_request_that_fails_to_join_fails_alone(engine: DecodeEngine) -> None:
    """A prefill error (here: a token id past the embedding table) ends that request only, at once."""
    events, done, sink = collect()
    bad_events, bad_done, bad_sink = collect(n=2)
    engine.submit(GenerationRequest([4, 5, 6], SamplingParams(max_tokens=40, ignore_eos=True, temperature=0), sink))
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.002)
    engine.submit(GenerationRequest([1, 10**7], SamplingParams(max_tokens=5), bad_sink, n=2))
    assert bad_done.wait(30) and done.wait(30)
    assert [(e.choice, e.finish_reason) for e in bad_events] == [(0, "error"), (1, "error")]
    assert all(e.error and "IndexError" in e.error for e in bad_events)
    assert [e.finish_reason for e in events if e.finish_reason] == ["length"]
    assert sum(e.token_id is not None for e in events) == 40


def test_a_failing_loop_turn_answers_its_admitted_requests_and_the_engine_goes_on() -> None:
    """If a turn of the loop fails after a request was admitted, its client gets an error, not a hang."""
    eng = DecodeEngine(load_model("tiny-random"), threads=1)
    real, calls = eng._step, []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        real()

    eng._step = flaky  # type: ignore[method-assign]
    eng.start()
    try:
        events, done, sink = collect()
        eng.submit(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=3), sink))
        assert done.wait(30)
        assert [(e.finish_reason, e.error) for e in events] == [("error", "RuntimeError: injected failure")]
        events2, done2, sink2 = collect()
        eng.submit(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), sink2))
        assert done2.wait(30) and [e.finish_reason for e in events2 if e.finish_reason] == ["length"]
    finally:
        eng.stop()
