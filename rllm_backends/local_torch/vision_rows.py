"""A vision-language model's training rows: their images back through the processor and the vision tower.

A row carries the images its prompt showed (`TrainRow.images`, as the agent sent them). The trainer decodes them,
runs the model's own image processor on each row's images exactly as the policy server ran the processor on that
request (the same PIL images, in the same order, as one sample), and the vision tower and connector turn the pixel
values into the features that replace the row's image-token embeddings; the decoder then scores the row as the
server sampled it (`packed_logprobs(images=...)`). Pixel values are cached per row's image list (a GRPO group's
samples share one), bounded.

By default the vision tower and connector are frozen (their features computed without autograd, as most VLM RL
recipes do); `train_vision` trains them too. With LoRA, adapters go on the text decoder only (`LORA_EXCLUDE`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from rllm_core.errors import TrainingError
from rllm_serve.vision import BadImage, image_features_grad, image_token_id, pixel_inputs, rope_index, uses_mrope

__all__ = ["LORA_EXCLUDE", "ChunkImages", "RowImages", "freeze_vision"]

LORA_EXCLUDE = r".*(vision_model|vision_tower|visual|connector|multi_modal_projector).*"
"""Modules of a vision-language model LoRA leaves alone (peft `exclude_modules`): the vision side."""
_VISION_PARTS = ("vision_model", "vision_tower", "visual", "connector", "multi_modal_projector")
_CACHE_ROWS = 256


def freeze_vision(model: torch.nn.Module) -> int:
    """Turn autograd off on the vision tower and connector; how many parameters were frozen."""
    frozen = 0
    for name, param in model.named_parameters():
        if any(f".{part}." in f".{name}" for part in _VISION_PARTS) and param.requires_grad:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


class RowImages:
    """Image features for packed rows, from each row's image sources."""

    def __init__(self, processor: Any, model: torch.nn.Module, train_vision: bool) -> None:
        if processor is None:
            raise TrainingError("a vision-language model is trained with its processor: load it with load_model "
                                "(it returns the processor beside the tokenizer)")
        self.processor = processor
        self.token = image_token_id(model)
        self.train_vision = train_vision
        self.mrope = uses_mrope(model)
        self._pixels: OrderedDict[tuple[str, ...], dict[str, torch.Tensor]] = OrderedDict()

    def pixels(self, sources: Sequence[str]) -> dict[str, torch.Tensor]:
        """The image processor's tensors for one row's images (as the server computed them for its request)."""
        key = tuple(sources)
        cached = self._pixels.get(key)
        if cached is not None:
            self._pixels.move_to_end(key)
            return cached
        try:
            cached = self._pixels[key] = pixel_inputs(self.processor, sources)
        except BadImage as exc:
            raise TrainingError(f"a training row's image cannot be read again: {exc}") from None
        if len(self._pixels) > _CACHE_ROWS:
            self._pixels.popitem(last=False)
        return cached

    def features(self, model: torch.nn.Module, rows: Sequence[Sequence[str]], tokens: Sequence[Sequence[int]]
                 ) -> torch.Tensor | None:
        """Every row's image features, row after row ([image tokens of all rows, hidden]); None without images.
        A row whose image tokens and features differ in number (cut by --max-seq-len) is one TrainingError."""
        parts: list[torch.Tensor] = []
        for r, (sources, ids) in enumerate(zip(rows, tokens, strict=True)):
            expected = sum(1 for t in ids if t == self.token)
            if not sources and not expected:
                continue
            if not sources:
                raise TrainingError(f"row {r} has {expected} image tokens but no images recorded on its step")
            with torch.set_grad_enabled(self.train_vision and torch.is_grad_enabled()):
                feats = image_features_grad(model, self.pixels(sources))
            if feats.shape[0] != expected:
                raise TrainingError(f"row {r} has {expected} image tokens for {feats.shape[0]} image features (a row "
                                    "cut inside an image by --max-seq-len?): raise --max-seq-len")
            parts.append(feats)
        return torch.cat(parts, 0) if parts else None

    def chunk(self, rows: Sequence[Any]) -> ChunkImages:
        """The images of one packed micro-batch's rows (`TrainRow`s), for `packed_logprobs`."""
        return ChunkImages(self, [list(r.images) for r in rows], [list(r.tokens) for r in rows])

    def positions(self, rows: Sequence[Sequence[str]], tokens: Sequence[Sequence[int]], model: torch.nn.Module
                  ) -> torch.Tensor:
        """Qwen2-VL's 3-D rotary positions [3, 1, N] of rows packed whole, one after another (each from 0)."""
        parts = [rope_index(model, ids, self.pixels(sources))[0] if sources else
                 torch.arange(len(ids), dtype=torch.long).expand(3, len(ids))
                 for sources, ids in zip(rows, tokens, strict=True)]
        return torch.cat(parts, 1)[:, None, :].to(next(model.parameters()).device)


class ChunkImages:
    """One micro-batch's images: `kwargs(model)` are `packed_logprobs`' image features (and 3-D positions)."""

    def __init__(self, owner: RowImages, rows: list[list[str]], tokens: list[list[int]]) -> None:
        self.owner, self.rows, self.tokens = owner, rows, tokens

    def kwargs(self, model: torch.nn.Module) -> dict[str, Any]:
        owner = self.owner
        out: dict[str, Any] = {"images": lambda m: owner.features(m, self.rows, self.tokens),
                               "image_token": owner.token}
        if owner.mrope and any(self.rows):  # rows with images are packed whole (no shared prefix)
            out["position_ids"] = owner.positions(self.rows, self.tokens, model)
        return out
