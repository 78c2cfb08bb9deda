"""Token log-probs of a causal LM, computed the way the policy server reports them.

Server rule (shared contract): the logprob of a sampled token is log_softmax(logits / T)[token], T the request
temperature (T = 0 → greedy, reported at T = 1). The trainer uses the same T so that, before any update, its
recomputed logprobs equal the sampler's and the first PPO ratio is 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rllm_backends.local_torch.serving.sampling import GREEDY_BELOW

__all__ = ["collate", "sequence_logprobs"]


def collate(seqs: Sequence[Sequence[float]], pad: float, dtype: torch.dtype, device: str | torch.device
            ) -> torch.Tensor:
    """Right-pad equal-typed sequences into one [B, T] tensor."""
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad, dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(list(s), dtype=dtype)
    return out.to(device)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    start: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T−start] of tokens start..T−1 given their prefixes (and the entropy there, detached).

    The vocabulary projection is the costliest part of a small model's step, so only the positions that
    predict tokens ≥ `start` (the first trained token of the micro-batch) go through it (`logits_to_keep`).
    Logits are upcast to fp32 before the softmax so bf16 autocast does not blur the ratio.
    """
    temp = temperature if temperature >= GREEDY_BELOW else 1.0  # the server's greedy threshold (as vLLM's)
    keep = input_ids_BT.shape[1] - start + 1
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, use_cache=False,
                       logits_to_keep=keep).logits
    logits_BTV = logits_BTV[:, -keep:-1].float()
    if temp != 1.0:
        logits_BTV = logits_BTV / temp
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    logprobs_BT = logp_BTV.gather(-1, input_ids_BT[:, start:].unsqueeze(-1)).squeeze(-1)
    entropy_BT = None
    if with_entropy:
        with torch.no_grad():
            entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    return logprobs_BT, entropy_BT
