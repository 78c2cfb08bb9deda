"""The batch-invariant linear layers (serving/invariant.py), at the embedded model's LM-head shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rllm_serve.invariant import (
    WIDE_MIN_ROWS,
    batch_invariant,
    make_batch_invariant,
    wide_linear,
)


@pytest.fixture(scope="module")
def head() -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(576, 49152, bias=False)  # SmolLM2-135M's tied LM head
    return layer.requires_grad_(False)


def test_the_slabbed_wide_product_is_f_linear_bit_for_bit(head: torch.nn.Linear) -> None:
    x = torch.randn(70, 576)
    assert torch.equal(wide_linear(x, head.weight), F.linear(x, head.weight))


def test_a_row_of_the_wide_head_has_the_same_bits_at_any_row_count(head: torch.nn.Linear) -> None:
    model = torch.nn.Sequential(head)
    make_batch_invariant(model)
    x = torch.randn(40, 576)
    with torch.inference_mode(), batch_invariant(True):
        alone = model(x[:1])[0]
        for rows in (2, 3, 5, WIDE_MIN_ROWS - 1, WIDE_MIN_ROWS, 13, 31, 40):
            assert torch.equal(model(x[:rows])[0], alone), rows
            assert torch.equal(model(x[rows - 1: rows + 1])[0], model(x[:rows])[rows - 1]), rows


def test_the_wide_path_keeps_autograd_when_gradients_are_on(head: torch.nn.Linear) -> None:
    layer = torch.nn.Linear(576, 49152, bias=False)
    model = torch.nn.Sequential(layer)
    make_batch_invariant(model)
    x = torch.randn(16, 576, requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    assert torch.allclose(model(x.detach()), F.linear(x.detach(), layer.weight), atol=1e-5)
