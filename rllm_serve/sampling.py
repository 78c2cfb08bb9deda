"""Sampling parameters and the one logprob rule training can trust.

The reported logprob of a sampled token is ``log_softmax(logits / T)[token]`` with T the request temperature
(T below ``GREEDY_BELOW`` = 1e-5, as in vLLM, means greedy decoding, reported at T = 1: dividing by a tinier T
overflows fp32 into NaN). top-p / top-k only restrict which tokens may be drawn; they
do not renormalise the reported value, so a trainer recomputing ``log_softmax(logits / T)`` over the same
tokens gets the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["GREEDY_BELOW", "SamplingParams", "sample_tokens", "scaled_logprobs", "top_logprobs", "top_logprobs_batch"]

GREEDY_BELOW = 1e-5
"""Temperatures below this decode greedily and report logprobs at T = 1 (vLLM's `_SAMPLING_EPS`)."""


@dataclass(frozen=True)
class SamplingParams:
    """What one choice is decoded with (already validated by the HTTP layer)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def scaled_logprobs(logits_BV: torch.Tensor, temperature_B: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / T)`` per row, in fp32; greedy rows (T < GREEDY_BELOW) use T = 1 (reported unscaled)."""
    t_B = torch.where(temperature_B >= GREEDY_BELOW, temperature_B, torch.ones_like(temperature_B))
    if bool((t_B == 1.0).all()):  # x / 1 is x: skip a pass over (rows, vocab)
        return torch.log_softmax(logits_BV.float(), dim=-1)
    return torch.log_softmax(logits_BV.float() / t_B[:, None], dim=-1)


def _filtered(lp_BV: torch.Tensor, params_B: list[SamplingParams]) -> torch.Tensor:
    """Set logprobs outside each row's top-k / top-p to -inf, all rows at once (reported values come before)."""
    _B, V = lp_BV.shape
    k_B = torch.tensor([p.top_k if p.top_k is not None and 0 < p.top_k < V else V for p in params_B],
                       device=lp_BV.device)
    p_B = torch.tensor([p.top_p for p in params_B], dtype=lp_BV.dtype, device=lp_BV.device)
    sorted_lp, order = torch.sort(lp_BV, dim=-1, descending=True)
    rank = torch.arange(V, device=lp_BV.device)[None]
    drop_sorted = rank >= k_B[:, None]
    if bool((p_B < 1.0).any()):
        probs = torch.softmax(sorted_lp.masked_fill(drop_sorted, float("-inf")), dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the first token always stays)
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted |= (before >= p_B[:, None]) & (p_B[:, None] < 1.0)
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return lp_BV.masked_fill(drop, float("-inf"))


def sample_tokens(logprobs_BV: torch.Tensor, params_B: list[SamplingParams],
                  generators_B: list[torch.Generator | None]) -> torch.Tensor:
    """Draw one token per row of `scaled_logprobs` (greedy rows take the argmax).

    Sampling is inverse-CDF with one uniform per row from that row's generator (so a seeded request is
    reproducible whatever else is in the batch); it costs a cumsum, where torch.multinomial over a 49k vocab
    took ~2 ms per row here. top-k / top-p filter all rows in one sort.
    """
    B, V = logprobs_BV.shape
    greedy = [p.greedy for p in params_B]
    if all(greedy):
        return torch.argmax(logprobs_BV, dim=-1)
    lp_BV = logprobs_BV
    if any(p.top_p < 1.0 or (p.top_k is not None and 0 < p.top_k < V) for p in params_B):
        lp_BV = _filtered(logprobs_BV, params_B)
    cdf_BV = torch.cumsum(torch.exp(lp_BV), dim=-1)
    u_B = torch.stack([torch.rand((), generator=g, device=lp_BV.device) for g in generators_B]) \
        if B else torch.zeros(0, device=lp_BV.device)
    sampled_B = torch.searchsorted(cdf_BV, (u_B * cdf_BV[:, -1])[:, None], right=True)[:, 0].clamp_(max=V - 1)
    if not any(greedy):
        return sampled_B
    greedy_B = torch.tensor(greedy, device=lp_BV.device)
    return torch.where(greedy_B, torch.argmax(logprobs_BV, dim=-1), sampled_B)


def top_logprobs_batch(logprobs_BV: torch.Tensor, k_B: list[int]) -> list[list[tuple[int, float]] | None]:
    """Each row's k most likely tokens (None where k is 0), from one topk over the rows that ask."""
    out: list[list[tuple[int, float]] | None] = [None] * len(k_B)
    asking = [i for i, k in enumerate(k_B) if k > 0]
    if not asking:
        return out
    kmax = max(k_B[i] for i in asking)
    values, ids = torch.topk(logprobs_BV[asking], kmax, dim=-1)
    for j, i in enumerate(asking):
        k = k_B[i]
        out[i] = [(int(t), float(v)) for t, v in zip(ids[j, :k].tolist(), values[j, :k].tolist(), strict=True)]
    return out


def top_logprobs(logprobs_V: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens under the same reported distribution, best first."""
    if k <= 0:
        return []
    values, ids = torch.topk(logprobs_V, k)
    return [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
