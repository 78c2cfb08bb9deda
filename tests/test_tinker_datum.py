"""TrainRow → tinker.types.Datum: the one-token shift, the mask carried by zero advantages, multi-turn rows,
advantage scales, and the errors for rows Tinker cannot train on. Real SDK types, built offline."""

from __future__ import annotations

import math

import pytest
import tinker  # noqa: F401  (in the dev extra: a missing SDK must fail here, not skip)

from rllm_backends.tinker.datum import row_to_datum, rows_to_datums
from rllm_core.errors import TrainingError
from rllm_core.types import Step, Trajectory
from rllm_train.packing import TrainRow, pack_trajectory


def _row(tokens: list[int], mask: list[int], lps: list[float], adv: float = 1.5, **kw: object) -> TrainRow:
    return TrainRow(tokens=tokens, loss_mask=mask, sampling_logprobs=lps, advantages=[adv * m for m in mask], **kw)


def _fields(datum) -> tuple[list[int], list[int], list[float], list[float]]:
    inputs = datum.loss_fn_inputs
    return (datum.model_input.to_ints(), inputs["target_tokens"].tolist(), inputs["logprobs"].tolist(),
            inputs["advantages"].tolist())


def test_single_turn_row_is_shifted_by_one() -> None:
    row = _row([5, 6, 7, 8, 9], [0, 0, 1, 1, 1], [0.0, 0.0, -0.5, -1.25, -2.0])
    (datum,) = rows_to_datums([row])
    model_input, targets, logprobs, advantages = _fields(datum)
    assert model_input == [5, 6, 7, 8]
    assert targets == [6, 7, 8, 9]  # target i is token i + 1 ...
    assert logprobs == [0.0, -0.5, -1.25, -2.0]  # ... with the logprob and advantage recorded at token i + 1
    assert advantages == [0.0, 1.5, 1.5, 1.5]
    assert set(datum.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
    assert datum.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert datum.loss_fn_inputs["logprobs"].dtype == "float32"
    assert datum.loss_fn_inputs["advantages"].shape == [4]


def test_multi_turn_packed_row_converts_without_special_case() -> None:
    """A two-turn trajectory packed into one row (prompt 0s, completion 1s, observation 0s, completion 1s):
    every observation token gets advantage 0 and logprob 0, every generated token its own values."""
    s1 = Step(prompt_token_ids=[1, 2, 3], completion_token_ids=[10, 11], logprobs=[-0.1, -0.2], token_source="server")
    s2 = Step(prompt_token_ids=[1, 2, 3, 10, 11, 20, 21, 22], completion_token_ids=[30, 31, 32],
              logprobs=[-0.3, -0.4, -0.5], token_source="server")
    rows, _ = pack_trajectory(Trajectory(steps=[s1, s2]), advantage=-0.75)
    (row,) = rows
    assert row.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    model_input, targets, logprobs, advantages = _fields(row_to_datum(row, scale=2.0))
    assert model_input == row.tokens[:-1]
    assert targets == [2, 3, 10, 11, 20, 21, 22, 30, 31, 32]
    assert logprobs == pytest.approx([0.0, 0.0, -0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4, -0.5])
    assert advantages == [0.0, 0.0, -1.5, -1.5, 0.0, 0.0, 0.0, -1.5, -1.5, -1.5]


def test_old_logprobs_replace_sampling_logprobs_when_recomputed() -> None:
    row = _row([1, 2, 3], [0, 1, 1], [0.0, -1.0, -2.0], old_logprobs=[9.0, -1.5, -2.5])
    _, _, logprobs, _ = _fields(row_to_datum(row))
    assert logprobs == [-1.5, -2.5]


def test_scales_multiply_each_rows_advantages() -> None:
    rows = [_row([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], adv=1.0),
            _row([4, 5, 6, 7], [0, 0, 1, 1], [0.0, 0.0, -1.0, -1.0], adv=-2.0)]
    d0, d1 = rows_to_datums(rows, [0.5, 0.25])
    assert _fields(d0)[3] == [0.5, 0.5]
    assert _fields(d1)[3] == [0.0, -0.5, -0.5]
    assert _fields(rows_to_datums(rows)[1])[3] == [0.0, -2.0, -2.0]


def test_trained_token_at_position_zero_is_dropped() -> None:
    """Token 0 has no prefix: it is never a target (the local trainer drops it as well)."""
    row = _row([1, 2, 3], [1, 1, 1], [-0.1, -0.2, -0.3])
    _, targets, logprobs, advantages = _fields(row_to_datum(row))
    assert targets == [2, 3]
    assert logprobs == pytest.approx([-0.2, -0.3])
    assert advantages == [1.5, 1.5]


def test_non_finite_values_off_the_mask_are_zeroed() -> None:
    row = _row([1, 2, 3, 4], [0, 0, 1, 1], [0.0, math.nan, -1.0, -1.0])
    _, _, logprobs, advantages = _fields(row_to_datum(row))
    assert logprobs == [0.0, -1.0, -1.0]
    assert advantages == [0.0, 1.5, 1.5]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logprob_on_a_trained_token_is_refused(bad: float) -> None:
    row = _row([1, 2, 3, 4], [0, 1, 1, 1], [0.0, -1.0, bad, -1.0], trajectory_id="t7")
    with pytest.raises(TrainingError, match=r"sampling_logprobs\[2\].*trained token") as err:
        rows_to_datums([row])
    assert "t7" in str(err.value)
    recomputed = _row([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], old_logprobs=[0.0, bad, -1.0])
    with pytest.raises(TrainingError, match=r"old_logprobs\[1\]"):
        row_to_datum(recomputed)


def test_non_finite_advantage_on_a_trained_token_is_refused() -> None:
    row = TrainRow(tokens=[1, 2, 3], loss_mask=[0, 1, 1], sampling_logprobs=[0.0, -1.0, -1.0],
                   advantages=[0.0, math.nan, 1.0])
    with pytest.raises(TrainingError, match=r"advantage\[1\]"):
        row_to_datum(row)


@pytest.mark.parametrize("tokens", [[], [7]])
def test_row_under_two_tokens_is_refused(tokens: list[int]) -> None:
    row = TrainRow(tokens=tokens, loss_mask=[1] * len(tokens), sampling_logprobs=[-1.0] * len(tokens),
                   advantages=[1.0] * len(tokens))
    with pytest.raises(TrainingError, match="at least 2"):
        rows_to_datums([row])


def test_bad_scales_are_refused() -> None:
    rows = [_row([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0])]
    with pytest.raises(TrainingError, match="2 advantage scales for 1 train rows"):
        rows_to_datums(rows, [1.0, 1.0])
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(TrainingError, match="finite and ≥ 0"):
            rows_to_datums(rows, [bad])
