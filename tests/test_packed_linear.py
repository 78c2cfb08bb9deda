"""Linear layers on oneDNN pre-packed weights: measured invariance, the same numbers as F.linear, chunked passes,
released dense weights, weight swaps (tied and untied), and what a copy of the model shares."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from rllm_serve import packed_linear
from rllm_serve.packed_linear import (
    PackedLayers,
    PackedWeight,
    invariant_from,
    pack_linear_layers,
    packing_available,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN (mkldnn)")


class Tiny(torch.nn.Module):
    """Two linear layers and a head tied to the input embedding, like a small decoder."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(300, 48)
        self.up = torch.nn.Linear(48, 96, bias=False)
        self.down = torch.nn.Linear(96, 48, bias=True)
        self.head = torch.nn.Linear(48, 300, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        self.head.weight = self.embed.weight

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(F.silu(self.up(self.embed(ids)))))


def test_invariance_is_measured_per_shape_and_is_small_here() -> None:
    first = invariant_from(1536, 576, torch.float32, max_rows=64)
    assert first is not None and 1 <= first <= 4  # at most a lone row is padded on this kind of CPU


def test_a_packed_layer_gives_f_linear_numbers_and_the_same_bits_at_any_row_count() -> None:
    model = Tiny()
    reference = copy.deepcopy(model)
    packed = pack_linear_layers(model, head_rows=64)
    assert set(packed.by_name) == {"up.weight", "down.weight", "head.weight"}
    x = torch.randn(70, 48, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model.down(model.up(x))
        assert torch.allclose(full, reference.down(reference.up(x)), atol=1e-5)
        for rows in (1, 2, 3, 5, 17, 64):
            for start in (0, 3):
                part = model.down(model.up(x[start: start + rows]))
                assert torch.equal(part, full[start: start + rows]), (rows, start)


def test_passes_longer_than_measured_are_chunked_with_the_same_bits() -> None:
    model = Tiny()
    pack_linear_layers(model, head_rows=8)  # the head was measured up to 8 rows: 21 rows go 8 + 8 + 5
    x = torch.randn(21, 48, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        whole = model.head(x)
        assert torch.equal(whole[5:13], model.head(x[5:13]))  # rows 5-12 cross the chunk boundary at 8
        assert torch.equal(whole[16:], model.head(x[16:]))
        assert torch.allclose(whole, F.linear(x, model.embed.weight), atol=1e-5)


def test_released_dense_weights_serve_the_same_and_can_be_read_back() -> None:
    model = Tiny()
    up_before = model.up.weight.detach().clone()
    ids = torch.tensor([[1, 5, 9, 200]])
    with torch.inference_mode():
        expected = model(ids)
    packed = pack_linear_layers(model, head_rows=64, release_dense=True)
    assert model.up.weight.is_meta and model.down.weight.is_meta
    assert not model.head.weight.is_meta and model.head.weight is model.embed.weight  # tied: kept
    assert torch.equal(model.up._rllm_packed.dense(), up_before)
    with torch.inference_mode():
        assert torch.allclose(model(ids), expected, atol=1e-5)
    x = torch.randn(3, 48, requires_grad=True)  # autograd through a released layer: rebuilt dense weight
    model.up(x).sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, up_before.sum(0).expand(3, -1), atol=1e-5)
    assert isinstance(packed, PackedLayers) and len(packed) == 3


@pytest.mark.parametrize("release", [False, True])
def test_a_swap_repacks_what_it_wrote_tied_head_included(release: bool) -> None:
    model = Tiny()
    packed = pack_linear_layers(model, head_rows=64, release_dense=release)
    new = {k: v + 0.05 for k, v in Tiny().state_dict().items()}
    own = model.state_dict()
    with torch.no_grad():
        for k, v in new.items():
            packed.update(k, own[k], v)
    fresh = Tiny()
    fresh.load_state_dict(new)
    ids = torch.tensor([[3, 4, 5]])
    with torch.inference_mode():
        assert torch.allclose(model(ids), fresh(ids), atol=1e-5)  # the head (written as embed.weight) too


def test_a_deep_copy_shares_packed_weights_and_keeps_them_across_a_swap() -> None:
    model = Tiny()
    packed = pack_linear_layers(model, head_rows=64, release_dense=True)
    old = copy.deepcopy(model)  # what swap_mode="finish" keeps for requests in flight
    assert old.up._rllm_packed is model.up._rllm_packed
    ids = torch.tensor([[7, 8]])
    with torch.inference_mode():
        before = old(ids)
        own = model.state_dict()
        packed.update("up.weight", own["up.weight"], torch.zeros(96, 48))
        assert torch.equal(old(ids), before)  # the copy still computes with the old weights
        assert not torch.allclose(model(ids), before)
    assert isinstance(old.up._rllm_packed, PackedWeight)


def test_an_in_place_change_of_a_kept_weight_is_repacked_not_served_stale() -> None:
    """A model passed in (own_model=False) is still its owner's: load_state_dict or an optimizer step on it must
    reach the packed copies, both through the layer's own forward and through `refresh` (the engine's check)."""
    model = Tiny()
    packed = pack_linear_layers(model, head_rows=64)
    new = {k: v + 0.05 for k, v in Tiny().state_dict().items()}
    model.load_state_dict(new)  # in place: torch bumps each parameter's version counter
    fresh = Tiny()
    fresh.load_state_dict(new)
    ids = torch.tensor([[3, 4, 5]])
    with torch.inference_mode():
        assert torch.allclose(model(ids), fresh(ids), atol=1e-5)  # repacked on use
        assert packed.refresh() == 0  # the forward already repacked every layer it used
        with torch.no_grad():
            model.up.weight.mul_(2)
            fresh.up.weight.mul_(2)
        assert packed.refresh() == 1
        assert torch.allclose(model(ids), fresh(ids), atol=1e-5)


def test_a_pass_of_no_rows_reads_no_weight_back(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Tiny()
    pack_linear_layers(model, head_rows=64, release_dense=True)
    monkeypatch.setattr(PackedWeight, "dense", lambda self: pytest.fail("dense() for an empty pass"))
    with torch.inference_mode():
        assert model.up(torch.empty(2, 0, 48)).shape == (2, 0, 96)


def test_fusions_pack_all_or_none() -> None:
    """One fusion that cannot be packed (a member with a bias) undoes the others: a half-fused model would run
    its fused layers through the slow read-back path. The layers are then packed alone."""
    model = Tiny()
    model.gate = torch.nn.Linear(48, 96, bias=False)
    holder = torch.nn.Module()
    ok: packed_linear.Fusion = (model, "_rllm_ok", [model.up, model.gate])
    bad: packed_linear.Fusion = (holder, "_rllm_bad", [model.down, torch.nn.Linear(96, 48, bias=False)])
    packed = pack_linear_layers(model, head_rows=64, fusions=[ok, bad])
    assert not hasattr(model, "_rllm_ok") and packed.fused_owners() == []
    assert getattr(model.up, "_rllm_part", None) is None and isinstance(model.up._rllm_packed, PackedWeight)
    assert {"up.weight", "gate.weight", "down.weight"} <= set(packed.by_name)


def test_a_failure_part_way_leaves_every_layer_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Tiny()
    up_before = model.up.weight.detach().clone()

    def broken(*_: object) -> None:
        for layer in (model.up, model.down):  # released, then the copy of the rest fails (out of memory, say)
            layer.weight = torch.nn.Parameter(torch.empty(layer.weight.shape, device="meta"), requires_grad=False)
        raise MemoryError("no room")

    monkeypatch.setattr(packed_linear, "_release_dense", broken)
    with pytest.raises(MemoryError):
        pack_linear_layers(model, head_rows=64, release_dense=True)
    for layer in (model.up, model.down, model.head):
        assert "forward" not in layer.__dict__ and not hasattr(layer, "_rllm_packed")
    assert torch.equal(model.up.weight, up_before)  # read back from the packed copy


def test_refresh_repacks_a_fused_weight_whose_member_changed_in_place() -> None:
    model = Tiny()
    model.gate = torch.nn.Linear(48, 96, bias=False)
    packed = pack_linear_layers(model, head_rows=64, fusions=[(model, "_rllm_ok", [model.up, model.gate])])
    with torch.no_grad():
        model.gate.weight.mul_(3)
    assert packed.refresh() == 1
    x = torch.randn(4, 48, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got = packed_linear.packed_matmul(x, model._rllm_ok)
    assert torch.allclose(got, F.linear(x, torch.cat([model.up.weight, model.gate.weight])), atol=1e-5)
