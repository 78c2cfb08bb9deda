"""Tensor names carry their shape as a suffix of axis letters (`logp_BT` is [B, T], `logits_KV` is [K, V]):
the letters, defined once for every package that names tensors this way (algorithms, trainers, the server).
"""

from __future__ import annotations

__all__ = ["AXES"]

AXES: dict[str, str] = {
    "B": "rows of a batch: train rows, or the sequences decoded in one engine step",
    "T": "token positions of a row",
    "V": "the vocabulary",
    "K": "the scored tokens of a packed micro-batch (positions that have a target)",
    "C": "one chunk of those K (scored a chunk at a time to bound the [K, V] logits)",
    "G": "groups: the attempts at one task by one role",
    "H": "the model's hidden size",
    "R": "response positions (verl's layout: the tokens after the prompt)",
}
