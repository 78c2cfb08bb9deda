"""rows_to_dataproto: our TrainRows in verl 0.9's agent-loop layout, checked field by field, and digested by
verl's own padding helpers the way its trainer feeds the actor (so log-probs line up with response tokens)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

import torch

from rllm_backends.verl.batch import (
    VerlBatchError,
    response_tensor_to_row_lists,
    rows_to_dataproto,
    scoring_temperature,
)
from rllm_core.errors import TrainingError
from rllm_train.packing import TrainRow

PAD = 0


def _row(prompt: list[int], segments: list[tuple[list[int], int]], *, adv: float, gid: str, tid: str,
         temperature: float | None = 1.0, old_shift: float | None = None) -> TrainRow:
    """A row: `prompt` (mask 0) then segments of (tokens, mask); logprobs −0.1·token where trained."""
    tokens, mask = list(prompt), [0] * len(prompt)
    for toks, m in segments:
        tokens += toks
        mask += [m] * len(toks)
    lps = [-0.1 * t if m else 0.0 for t, m in zip(tokens, mask, strict=True)]
    return TrainRow(tokens=tokens, loss_mask=mask, sampling_logprobs=lps,
                    advantages=[adv] * len(tokens),  # non-zero on prompt tokens on purpose: must be masked
                    old_logprobs=None if old_shift is None else [lp + old_shift for lp in lps],
                    temperature=temperature, group_id=gid, trajectory_id=tid)


@pytest.fixture
def rows() -> list[TrainRow]:
    return [
        _row([5, 6, 7], [([8, 9], 1)], adv=1.0, gid="g0", tid="t0"),                          # P 3, R 2
        _row([11], [([12, 13, 14, 15], 1)], adv=-0.5, gid="g0", tid="t1", old_shift=0.25),  # P 1, R 4
        _row([21, 22], [([23, 24], 1), ([25, 26], 0), ([27], 1)], adv=2.0, gid="g1", tid="t2"),  # multi-turn
    ]


def test_shapes_padding_sides_and_ids(rows: list[TrainRow]) -> None:
    data = rows_to_dataproto(rows, pad_token_id=PAD)
    b = data.batch
    assert b["prompts"].shape == (3, 3), "prompt width is the longest prompt"
    assert b["responses"].shape == (3, 5), "response width is the longest response (observations included)"
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (3, 8)
    for key in ("response_mask", "rollout_log_probs", "old_log_probs", "advantages"):
        assert b[key].shape == (3, 5), f"{key} is response-aligned"
    assert b["prompts"].tolist() == [[5, 6, 7], [PAD, PAD, 11], [PAD, 21, 22]], "prompts are LEFT-padded"
    assert b["responses"].tolist() == [[8, 9, PAD, PAD, PAD], [12, 13, 14, 15, PAD], [23, 24, 25, 26, 27]], \
        "responses are RIGHT-padded"
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert b[key].dtype == torch.int64, f"{key} is int64 as in verl's agent loop"
    for key in ("rollout_log_probs", "old_log_probs", "advantages"):
        assert b[key].dtype == torch.float32, f"{key} is float32"


def test_masks_and_positions(rows: list[TrainRow]) -> None:
    from verl.utils.model import compute_position_id_with_mask

    b = rows_to_dataproto(rows, pad_token_id=PAD).batch
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1, 0],
                                            [0, 1, 1, 1, 1, 1, 1, 1]], "attention is 1 on every real token"
    assert b["response_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 1]], \
        "the observation inside the multi-turn response has response_mask 0 (and attention 1)"
    assert torch.equal(b["position_ids"], compute_position_id_with_mask(b["attention_mask"])), \
        "position ids as verl computes them"
    assert b["position_ids"][1].tolist() == [0, 0, 0, 1, 2, 3, 4, 4]
    for i, row in enumerate(rows):
        real = b["attention_mask"][i].bool()
        assert b["position_ids"][i][real].tolist() == list(range(len(row.tokens))), f"row {i}: 0..L-1"
        assert b["input_ids"][i][real].tolist() == row.tokens, f"row {i}: real tokens are the row's, in order"


def test_logprobs_advantages_and_non_tensors(rows: list[TrainRow]) -> None:
    data = rows_to_dataproto(rows, pad_token_id=PAD)
    b = data.batch
    expect_lp = [[-0.8, -0.9, 0, 0, 0], [-1.2, -1.3, -1.4, -1.5, 0], [-2.3, -2.4, 0, 0, -2.7]]
    assert torch.allclose(b["rollout_log_probs"], torch.tensor(expect_lp)), "behaviour logprobs on the response"
    expect_old = [expect_lp[0], [x + 0.25 if x else 0.0 for x in expect_lp[1]], expect_lp[2]]
    assert torch.allclose(b["old_log_probs"], torch.tensor(expect_old)), \
        "old_log_probs: row.old_logprobs when given, else the behaviour logprobs (0 where masked)"
    assert b["advantages"].tolist() == [[1, 1, 0, 0, 0], [-0.5, -0.5, -0.5, -0.5, 0], [2, 2, 0, 0, 2]], \
        "advantages only on trained response tokens"
    assert list(data.non_tensor_batch["uid"]) == ["g0", "g0", "g1"], "uid is the group id"
    assert list(data.non_tensor_batch["trajectory_id"]) == ["t0", "t1", "t2"]
    assert data.meta_info["temperature"] == 1.0
    assert data.meta_info["global_batch_size"] == data.meta_info["mini_batch_size"] == 3
    assert data.meta_info["pad_token_id"] == PAD
    assert data.meta_info["global_token_num"] == [5, 5, 7]
    assert not {"token_level_rewards", "returns"} & set(b.keys()), "the actor update reads neither"


def test_fixed_widths_and_position_zero() -> None:
    row = _row([], [([3], 1), ([4, 5], 1)], adv=1.0, gid="g", tid="t")  # the first token is marked trained
    data = rows_to_dataproto([row], pad_token_id=9, max_prompt_len=4, max_response_len=6)
    b = data.batch
    assert b["prompts"].tolist() == [[9, 9, 9, 3]], "position 0 is never trained: it becomes the prompt"
    assert b["responses"].tolist() == [[4, 5, 9, 9, 9, 9]] and b["response_mask"].tolist() == [[1, 1, 0, 0, 0, 0]]
    with pytest.raises(VerlBatchError, match="max_prompt_len ≥ 3"):
        rows_to_dataproto([_row([1, 2, 3], [([4], 1)], adv=1, gid="g", tid="t")], pad_token_id=0, max_prompt_len=2)
    with pytest.raises(VerlBatchError, match="max_response_len ≥ 2"):
        rows_to_dataproto([row], pad_token_id=0, max_response_len=1)


def test_temperatures() -> None:
    hot = _row([1], [([2], 1)], adv=1, gid="g", tid="hot", temperature=0.7)
    unknown = _row([1], [([2], 1)], adv=1, gid="g", tid="unknown", temperature=None)
    greedy = _row([1], [([2], 1)], adv=1, gid="g", tid="greedy", temperature=0.0)
    one = _row([1], [([2], 1)], adv=1, gid="g", tid="one", temperature=1.0)
    assert rows_to_dataproto([hot, unknown], pad_token_id=0, temperature=0.7).meta_info["temperature"] == 0.7
    assert scoring_temperature([greedy, one]) == 1.0, "greedy rows were reported at T = 1"
    with pytest.raises(VerlBatchError, match=r"rows mix sampling temperatures 0\.7 \(hot\), 1 \(one\)"):
        rows_to_dataproto([hot, one], pad_token_id=0)
    with pytest.raises(VerlBatchError, match="records no sampling temperature; pass temperature="):
        rows_to_dataproto([unknown], pad_token_id=0)


@pytest.mark.parametrize(("rows", "message"), [
    ([], "the batch is empty"),
    ([_row([1, 2], [([3], 0)], adv=1, gid="g", tid="t")], "no trained token after position 0"),
    ([_row([], [([3], 1)], adv=1, gid="g", tid="t")], "no trained token after position 0"),
])
def test_bad_rows_are_refused(rows: list[TrainRow], message: str) -> None:
    with pytest.raises(VerlBatchError, match=message) as info:
        rows_to_dataproto(rows, pad_token_id=0)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TrainingError)
    assert "\n" not in str(info.value), "one-line message"


def test_bad_pad_token_id() -> None:
    with pytest.raises(VerlBatchError, match="pad_token_id must be a non-negative int"):
        rows_to_dataproto([_row([1], [([2], 1)], adv=1, gid="g", tid="t")], pad_token_id=-1)


def test_verl_padding_helpers_line_up_with_our_layout(rows: list[TrainRow]) -> None:
    """verl's trainer strips padding (left_right_2_no_padding) and slices the model's per-position outputs back
    to the response (no_padding_2_padding). Feed it "log-probs" that are the next token's id: what comes back
    must be our responses, i.e. verl scores exactly the tokens we put in the response."""
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    data = rows_to_dataproto(rows, pad_token_id=PAD)
    td = left_right_2_no_padding(data.to_tensordict())
    assert [t.tolist() for t in td["input_ids"].unbind()] == [r.tokens for r in rows], "unpadded sequences"
    assert [t.tolist() for t in td["position_ids"].unbind()] == [list(range(len(r.tokens))) for r in rows]
    assert td["temperature"] == 1.0 and td["global_batch_size"] == 3, "meta_info reaches the TensorDict"
    next_token = torch.cat([torch.roll(t, -1) for t in td["input_ids"].unbind()]).to(torch.float32)
    nested = torch.nested.nested_tensor_from_jagged(next_token, offsets=td["input_ids"].offsets())
    sliced = no_padding_2_padding(nested, td)
    real = data.batch["attention_mask"][:, data.batch["prompts"].shape[1]:].bool()
    assert torch.equal(sliced[real], data.batch["responses"][real].to(torch.float32)), \
        "position p's output scores token p+1: the response slice is our response tokens"
    back = response_tensor_to_row_lists(data.batch["rollout_log_probs"], data)
    for i, r in enumerate(rows):
        expect = [lp * m for lp, m in zip(r.sampling_logprobs, r.loss_mask, strict=True)]
        assert back[i] == pytest.approx(expect, abs=1e-6), f"row {i}: the inverse maps values onto row positions"
    with pytest.raises(VerlBatchError, match="expected a response tensor of shape"):
        response_tensor_to_row_lists(torch.zeros(3, 2), data)
