"""Retokenized steps are trainable only when the server's logprobs provably belong to our tokens, one by one:
equal counts with other token boundaries (or no token strings at all) keep the step untrainable, with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from rllm_core.types import Step
from rllm_rollout.capture.retokenize import retokenize_step


@pytest.fixture(scope="module")
def tok() -> Any:
    from rllm_serve.models import load_tokenizer

    return load_tokenizer("tiny-random")


def _step(tokens: list[str] | None, logprobs: list[float]) -> Step:
    metadata: dict[str, Any] = {"server_logprobs": logprobs}
    if tokens is not None:
        metadata["server_logprob_tokens"] = tokens
    return Step(endpoint="completions", prompt="Say", text="Hello there", finish_reason="length", metadata=metadata)


def test_logprobs_that_line_up_token_by_token_are_trained(tok: Any) -> None:
    ids = tok.encode("Hello there", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    step = retokenize_step(_step(pieces, [-0.1] * len(ids)), tok)
    assert step.trainable and step.logprobs == [-0.1] * len(ids) and step.completion_token_ids == ids


def test_equal_counts_with_other_boundaries_are_not_trained(tok: Any) -> None:
    ids = tok.encode("Hello there", add_special_tokens=False)
    assert len(ids) == 2
    step = retokenize_step(_step(["Hel", "lo there"], [-0.1, -0.2]), tok)
    assert not step.trainable and step.logprobs is None
    assert "token 0" in step.metadata["retokenize_mismatch"]
    step = retokenize_step(_step(None, [-0.1, -0.2]), tok)
    assert not step.trainable and "no token strings" in step.metadata["retokenize_mismatch"]
