"""One packed forward pass of the engine: the step's new tokens as batch rows, logits only where sampled.

A Llama served with the compiled kernels runs `fast_forward` (its own lean forward); any other model runs
transformers' forward under the `rllm_paged` attention.

Every fed token is its own row of input shape (tokens, 1), with its position id, its adapter name (peft) and
its KV slot; `paged_attention` gets the rest from the StepPlan. The language-model head runs only on the rows
whose logits are sampled (the last token of each finished feed), not on every prompt token: for a 49k vocabulary
that is a fifth of a prefill's compute.
"""

from __future__ import annotations

from typing import Any

import torch

from rllm_serve.attention_kernel import kernel_available, kernel_plan
from rllm_serve.fast_forward import fast_forward
from rllm_serve.kv_pool import KVPool
from rllm_serve.paged_attention import (
    Segment,
    StepPlan,
    current_plan,
    plan_scope,
    pow2_width,
    visible_keys,
)
from rllm_serve.vision import rope_positions
from rllm_serve.work import Work

__all__ = ["run_forward"]


def _select_logit_rows(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook on the LM head: inside an engine step, keep only the hidden states to be sampled."""
    plan = current_plan()
    if plan is None or plan.logit_rows is None:
        return None
    return (args[0][plan.logit_rows], *args[1:])


def _install_head_hook(model: Any) -> None:
    head = model.get_output_embeddings()
    if head is not None and not getattr(head, "_rllm_rows_hook", False):
        head.register_forward_pre_hook(_select_logit_rows)
        head._rllm_rows_hook = True


def _image_embeds(model: Any, ids_T: torch.Tensor, items: list[tuple[Work, int]]) -> torch.Tensor:
    """The fed tokens' input embeddings, the image tokens' rows replaced by their image's features (computed
    once per request and policy version): what transformers' vision-language models merge before the decoder."""
    embeds = model.get_input_embeddings()(ids_T)
    row = 0
    for w, n in items:
        vision = w.request.vision
        c = w.table.computed
        if vision is not None and any(p in vision.row_of for p in range(c, c + n)):
            feats = vision.features(model, w.version)
            pairs = [(row + p - c, vision.row_of[p]) for p in range(c, c + n) if p in vision.row_of]
            at = torch.tensor([a for a, _ in pairs], dtype=torch.long, device=embeds.device)
            src = torch.tensor([k for _, k in pairs], dtype=torch.long, device=feats.device)
            embeds[at] = feats[src].to(embeds.device, embeds.dtype)
        row += n
    return embeds


def run_forward(model: Any, pool: KVPool, items: list[tuple[Work, int]], adapters: bool, base_name: str,
                vision: bool = False, mrope: bool = False) -> torch.Tensor:
    """Feed `n` tokens of each work item; advance their tables; return fp32 logits (items fed to their end, V).
    `vision`: a vision-language model, fed embeddings with the prompts' image features in place; `mrope`: its
    decoder takes 3-D rotary positions (Qwen2-VL), while the KV layout and causality keep the 1-D ones."""
    _install_head_hook(model)
    device = pool.keys[0].device
    bs = pool.block_size
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    names: list[str] = []
    decode_rows: list[int] = []
    decode_tables: list[list[int]] = []
    decode_pos: list[int] = []
    prefills: list[Segment] = []
    logit_rows: list[int] = []
    use_kernel = kernel_available(pool.keys[0].dtype, device)
    seq_of: list[int] = []
    seq_tables: list[list[int]] = []
    for w, n in items:
        start, c = len(ids), w.table.computed
        ids.extend(w.tokens[c: c + n])
        pos.extend(range(c, c + n))
        slots.extend(w.table.slot(p, bs) for p in range(c, c + n))
        names.extend([base_name if w.adapter is None else w.adapter] * n)
        if c + n == len(w.tokens):
            logit_rows.append(start + n - 1)
        if use_kernel:
            seq_of.extend([len(seq_tables)] * n)
            seq_tables.append(w.table.blocks)
        elif n == 1:
            decode_rows.append(start)
            decode_tables.append(w.table.blocks[: c // bs + 1])
            decode_pos.append(c)
        else:
            prefills.append(Segment(start, n, c, list(w.table.blocks)))
    width = pow2_width(max((len(t) for t in decode_tables), default=1))
    tables = torch.tensor([t + [0] * (width - len(t)) for t in decode_tables], dtype=torch.long,
                          device=device).view(len(decode_tables), width)
    positions = torch.tensor(decode_pos, dtype=torch.long, device=device)
    plan = StepPlan(
        slots=torch.tensor(slots, dtype=torch.long, device=device),
        decode_rows=torch.tensor(decode_rows, dtype=torch.long, device=device),
        decode_tables=tables, decode_pos=positions,
        decode_visible=visible_keys(tables, positions[:, None], bs) if decode_tables else None,
        prefills=prefills, pool_keys=pool.keys, pool_values=pool.values, block_size=bs,
        logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=device),
        kernel=kernel_plan(slots, pos, seq_of, seq_tables) if use_kernel else None,
    )
    ids_T = torch.tensor(ids, dtype=torch.long, device=device)
    pos_T = torch.tensor(pos, dtype=torch.long, device=device)
    fast = fast_forward(model) if use_kernel else None
    if fast is not None:
        logits_KV = fast(ids_T, pos_T, plan)
    else:
        kwargs: dict[str, Any] = {}
        if adapters:
            kwargs["adapter_names"] = names
        if vision:
            kwargs["inputs_embeds"] = _image_embeds(model, ids_T, items)[:, None]
        else:
            kwargs["input_ids"] = ids_T[:, None]
        rope = (torch.cat([rope_positions(w.request.vision, w.table.computed, n) for w, n in items], 1)[:, :, None]
                .to(device) if mrope else pos_T[:, None])
        with plan_scope(plan):
            out = model(position_ids=rope, use_cache=False, **kwargs)
        logits_KV = out.logits
        if logits_KV.shape[0] != len(logit_rows):  # a head the hook could not reach: every row came back
            logits_KV = logits_KV[plan.logit_rows]
        logits_KV = logits_KV[:, -1].float()
    for w, n in items:
        w.table.computed += n
    return logits_KV
