"""Token log-probs of a causal LM, computed the way the policy server reports them.

Server rule (shared contract): the logprob of a sampled token is log_softmax(logits / T)[token], T the request
temperature (T = 0 → greedy, reported at T = 1). The trainer uses the same T so that, before any update, its
recomputed logprobs equal the sampler's and the first PPO ratio is 1.

Two ways to score a micro-batch. `sequence_logprobs`: right-padded [B, T] rows through the whole CausalLM.
`packed_logprobs` (the trainer's, issue 16): the rows concatenated into one [1, N] sequence with positions
restarting per row, under the PACKED_ATTENTION implementation (causal SDPA within each row: no padding and no
N × N mask), and only the trained positions through lm_head, LOGPROB_CHUNK at a time, so the fp32
[positions × vocab] logits of the whole micro-batch never exist at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rllm_backends.local_torch.packed_rows import PackedRows, PrefixGroup, pack_rows
from rllm_serve.sampling import GREEDY_BELOW

__all__ = ["LOGPROB_CHUNK", "PACKED_ATTENTION", "PackedRows", "chunked_token_logprobs", "collate",
           "enable_packed_attention", "pack_rows", "packed_logprobs", "sequence_logprobs"]


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


# ---------------------------------------------------------------------------------------------- packed rows
PACKED_ATTENTION = "rllm_packed_sdpa"
"""transformers attention implementation the trainer's model runs under: SDPA per packed row when the forward
names the pack's groups (`packed_groups`), plain SDPA otherwise (so a copy of the model serves unchanged)."""
LOGPROB_CHUNK = 512
"""Positions put through the vocabulary projection at once: bounds the [positions × vocab] fp32 logits."""

_NO_MASK: ContextVar[bool] = ContextVar("rllm_packed_no_mask", default=False)
"""Set during a packed forward: no [tokens × tokens] mask is built (the attention splits by row itself)."""


def _packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal SDPA within each packed row (query [1, H, N, D] → [1, N, H, D]), a group's rows each seeing the
    prefix they share (`PrefixGroup`): a block mask over the pack would cost N² per layer where the rows need
    only Σ len². Without `packed_groups`, plain SDPA."""
    groups: tuple[PrefixGroup, ...] | None = kwargs.pop("packed_groups", None)
    if groups is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    n_rep = int(getattr(module, "num_key_value_groups", 1))
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    p = dropout if module.training else 0.0
    # one split per tensor, not a slice per row: a slice's backward writes its gradient into a zeroed tensor
    # the size of the whole pack (a pack of 40 rows zeroed 40 packs per tensor and layer); a split's is one cat
    sizes = [n for g in groups for n in ((g.prefix,) if g.prefix else ()) + tuple(g.suffixes)]
    qs, ks, vs = query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2)
    def causal(i: int) -> torch.Tensor:
        return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], dropout_p=p, is_causal=True, scale=scaling)

    outs: list[torch.Tensor] = []
    i = 0
    for g in groups:
        pre = i if g.prefix else None
        if pre is not None:
            outs.append(causal(pre))
            i += 1
        for n in g.suffixes:
            if pre is None:
                outs.append(causal(i))
            else:  # the whole shared prefix, then causal within the row
                sees = torch.ones(n, g.prefix + n, dtype=torch.bool, device=query.device).tril_(g.prefix)
                outs.append(F.scaled_dot_product_attention(
                    qs[i], torch.cat([ks[pre], ks[i]], 2), torch.cat([vs[pre], vs[i]], 2), attn_mask=sees,
                    dropout_p=p, scale=scaling))
            i += 1
    return torch.cat(outs, 2).transpose(1, 2).contiguous(), None


def _packed_mask(*args: Any, **kwargs: Any) -> Any:
    return None if _NO_MASK.get() else sdpa_mask(*args, **kwargs)


AttentionInterface.register(PACKED_ATTENTION, _packed_sdpa)
AttentionMaskInterface.register(PACKED_ATTENTION, _packed_mask)


def _causal_lm(model: torch.nn.Module) -> Any:
    """The transformers CausalLM inside `model` (a PeftModel's base model: its LoRA layers stay in place)."""
    get_base: Any = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def enable_packed_attention(model: torch.nn.Module) -> bool:
    """Switch an SDPA model to PACKED_ATTENTION (same results unpacked) so it can run `packed_logprobs`.
    False, model unchanged, for a model that cannot: other attention, a custom logit transform after lm_head,
    or no separate decoder / output embedding."""
    lm = _causal_lm(model)
    cfg = getattr(lm, "config", None)
    if cfg is None or getattr(cfg, "_attn_implementation", None) not in ("sdpa", PACKED_ATTENTION):
        return False
    if any(getattr(cfg, k, None) not in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale")):
        return False
    if not isinstance(getattr(lm, "base_model", None), torch.nn.Module) or lm.base_model is lm:
        return False
    if not isinstance(lm.get_output_embeddings(), torch.nn.Module):
        return False
    try:
        lm.set_attn_implementation(PACKED_ATTENTION)
    except (AttributeError, ValueError):
        return False
    return bool(cfg._attn_implementation == PACKED_ATTENTION)


def packed_logprobs(model: torch.nn.Module, packed: PackedRows, temperature: float = 1.0,
                    with_entropy: bool = False, chunk: int = LOGPROB_CHUNK, checkpoint: bool = False,
                    images: Callable[[torch.nn.Module], torch.Tensor | None] | None = None, image_token: int = -1,
                    position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [K] of the packed rows' scored tokens (and their entropy, detached), the same rule as
    `sequence_logprobs`. The model must have `enable_packed_attention`. Only the K scored positions go through
    lm_head, `chunk` at a time; `checkpoint` recomputes each chunk's logits in backward instead of keeping its
    [chunk × vocab] log-softmax (less memory, one more lm_head matmul). `images(model)`: a vision-language
    model's features for the pack's `image_token` positions, in pack order (vision_rows.py); `position_ids`:
    positions other than the pack's own (Qwen2-VL's 3-D rotary ones, [3, 1, N])."""
    lm = _causal_lm(model)
    inputs: dict[str, Any] = {"input_ids": packed.input_ids_1N}
    if images is not None:  # a vision-language model: its decoder, fed embeddings with the image features in place
        inputs = {"inputs_embeds": _with_images(lm, packed.input_ids_1N, images(model), image_token)}
    token = _NO_MASK.set(True)
    try:
        body = lm.get_decoder() if images is not None else lm.base_model
        positions = packed.position_ids_1N if position_ids is None else position_ids
        hidden_1NH = body(**inputs, position_ids=positions, use_cache=False,
                          packed_groups=packed.groups).last_hidden_state
    finally:
        _NO_MASK.reset(token)
    hidden_KH = hidden_1NH[0].index_select(0, packed.source_K)
    return chunked_token_logprobs(hidden_KH, lm.get_output_embeddings(), packed.input_ids_1N[0, packed.index_K],
                                  temperature, with_entropy, chunk, checkpoint)


def _with_images(lm: Any, ids_1N: torch.Tensor, feats: torch.Tensor | None, image_token: int) -> torch.Tensor:
    """The input embeddings with the image tokens' rows replaced by the image features (transformers' merge)."""
    embeds = lm.get_input_embeddings()(ids_1N)
    where = ids_1N == image_token
    found = int(where.sum())
    if found != (0 if feats is None else feats.shape[0]):
        raise ValueError(f"{found} image tokens in the pack for {0 if feats is None else feats.shape[0]} features")
    if feats is None:
        return embeds
    return embeds.masked_scatter(where[..., None].expand_as(embeds), feats.to(embeds.dtype))


def chunked_token_logprobs(hidden_KH: torch.Tensor, lm_head: torch.nn.Module, targets_K: torch.Tensor,
                           temperature: float = 1.0, with_entropy: bool = False, chunk: int = LOGPROB_CHUNK,
                           checkpoint: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax(lm_head(h) / T)[target] for K positions, `chunk` positions at a time (fp32 softmax)."""
    if chunk < 1:
        raise ValueError(f"chunked_token_logprobs: chunk must be ≥ 1, got {chunk}")
    temp = temperature if temperature >= GREEDY_BELOW else 1.0  # the server's greedy threshold (as vLLM's)
    logps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    positions = hidden_KH.shape[0]
    # chunks of equal size: 1100 positions as 3 × 367, not 512 + 512 + 76 (a 76-row product of the 49k-wide
    # head ran at a tenth of the matmul rate here)
    chunk = -(-positions // -(-positions // chunk)) if positions else chunk
    for a in range(0, positions, chunk):
        args = (lm_head, hidden_KH[a : a + chunk], targets_K[a : a + chunk], temp, with_entropy)
        if checkpoint and torch.is_grad_enabled():
            lp, ent = torch.utils.checkpoint.checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        logps.append(lp)
        if ent is not None:
            ents.append(ent)
    if not logps:
        empty = hidden_KH.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def _chunk_logprobs(lm_head: torch.nn.Module, h_CH: torch.Tensor, t_C: torch.Tensor, temp: float,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits_CV = lm_head(h_CH).float()
    if temp != 1.0:
        logits_CV = logits_CV / temp
    logp_CV = torch.log_softmax(logits_CV, dim=-1)
    ent_C = None
    if with_entropy:
        with torch.no_grad():
            ent_C = -(logp_CV.exp() * logp_CV).sum(-1)
    return logp_CV.gather(-1, t_C.unsqueeze(-1)).squeeze(-1), ent_C
