"""The engine's own forward pass for Llama decoders: the same arithmetic as transformers', in fewer operations.

At 8 decode rows a SmolLM2 step was ~66 ms: 37 streaming the linear weights, 5 in attention, and ~24 in the
~60 small operations and ~15 module calls per layer around them (norms, rotary embedding, reshapes, kernel
plumbing). Here a layer is: RMSNorm, one packed q|k|v product, the compiled attention (which applies the rotary
embedding to q and k itself, writes k and v into the pool and attends), o_proj and the residual, RMSNorm, one
packed gate|up product, SiLU·up, down_proj and the residual. Fusing q|k|v also saves a third of their time at
64 rows (k and v alone are thin, 192-wide products).

Exactness: the same formulas as transformers' Llama modules, in fp32 (`torch.rms_norm` gives the same bits as
its RMSNorm; the rotary cos/sin come from the model's own rotary module); only the rotary products may be fused
into multiply-adds, within rounding. Every row is computed by itself, so batch invariance is kept (tests compare
the served logprobs with a fresh transformers forward within 1e-4, and seeded requests bit for bit).

Used for plain (non-peft) LlamaForCausalLM models on CPU with the compiled attention and packed weights; any
other model keeps the transformers forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rllm_serve.attention_kernel import paged_attend
from rllm_serve.packed_linear import Fusion, PackedWeight, packed_matmul
from rllm_serve.paged_attention import StepPlan

__all__ = ["FastForward", "fast_forward", "fusions"]

QKV = "_rllm_qkv"
GATE_UP = "_rllm_gate_up"


def _layers(model: Any) -> list[Any] | None:
    """The decoder layers when the model is a plain transformers Llama this forward computes exactly."""
    try:
        from transformers.models.llama.modeling_llama import (
            LlamaAttention,
            LlamaDecoderLayer,
            LlamaForCausalLM,
            LlamaMLP,
            LlamaRMSNorm,
        )
    except ImportError:  # pragma: no cover - transformers always has Llama
        return None
    if type(model) is not LlamaForCausalLM or getattr(model, "peft_config", None):
        return None
    cfg = model.config
    if (cfg.hidden_act != "silu" or getattr(cfg, "pretraining_tp", 1) != 1 or getattr(cfg, "attention_bias", False)
            or getattr(cfg, "mlp_bias", False)):
        return None
    layers = list(model.model.layers)
    for layer in layers:
        if (type(layer) is not LlamaDecoderLayer or type(layer.self_attn) is not LlamaAttention
                or type(layer.mlp) is not LlamaMLP or type(layer.input_layernorm) is not LlamaRMSNorm
                or type(layer.post_attention_layernorm) is not LlamaRMSNorm):
            return None
    return layers if type(model.model.norm) is LlamaRMSNorm else None


def fusions(model: Any) -> list[Fusion]:
    """The weights to pack together for this forward (q|k|v, gate|up per layer); [] for a model it cannot run."""
    layers = _layers(model)
    if layers is None:
        return []
    out: list[Fusion] = []
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        out += [(layer, QKV, [a.q_proj, a.k_proj, a.v_proj]), (layer, GATE_UP, [m.gate_proj, m.up_proj])]
    return out


class FastForward:
    """One engine step of a Llama whose fused weights are packed: input ids and positions in, the sampled rows'
    fp32 logits out."""

    def __init__(self, model: Any, layers: list[Any]) -> None:
        self.model, self.layers = model, layers
        cfg = model.config
        self.hidden = int(cfg.hidden_size)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(layers[0].self_attn.head_dim)
        self.inter = int(layers[0].mlp.intermediate_size)

    def __call__(self, ids_T: torch.Tensor, pos_T: torch.Tensor, plan: StepPlan) -> torch.Tensor:
        assert plan.kernel is not None and plan.logit_rows is not None
        base = self.model.model
        T, hd, kd = ids_T.shape[0], self.heads * self.head_dim, self.kv_heads * self.head_dim
        h = F.embedding(ids_T, base.embed_tokens.weight)
        cos, sin = base.rotary_emb(h[None], pos_T[None])
        rope = (cos[0].float().contiguous(), sin[0].float().contiguous())
        shape = (self.hidden,)
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = torch.rms_norm(h, shape, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
            qkv = packed_matmul(x, getattr(layer, QKV))
            q = qkv[:, :hd].view(T, self.heads, self.head_dim)
            k = qkv[:, hd: hd + kd].view(T, self.kv_heads, self.head_dim)
            v = qkv[:, hd + kd:].view(T, self.kv_heads, self.head_dim)
            out = paged_attend(q, k, v, plan.pool_keys[i], plan.pool_values[i], plan.kernel, attn.scaling, rope)
            h = h + attn.o_proj(out.view(T, hd))
            norm = layer.post_attention_layernorm
            gate_up = packed_matmul(torch.rms_norm(h, shape, norm.weight, norm.variance_epsilon),
                                    getattr(layer, GATE_UP))
            h = h + mlp.down_proj(F.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter:])
        h = torch.rms_norm(h[plan.logit_rows], shape, base.norm.weight, base.norm.variance_epsilon)
        return self.model.lm_head(h).float()


def fast_forward(model: Any) -> FastForward | None:
    """The fast forward of `model` once its fused weights are packed (`fusions` given to pack_linear_layers),
    else None. Kept on the model, so a copy of it (swap_mode="finish") gets its own, on its own weights."""
    cached = model.__dict__.get("_rllm_fast_forward")
    if cached is not None:
        return cached
    layers = _layers(model)
    if not layers or not all(isinstance(getattr(layer, QKV, None), PackedWeight)
                             and isinstance(getattr(layer, GATE_UP, None), PackedWeight) for layer in layers):
        return None
    model.__dict__["_rllm_fast_forward"] = fast = FastForward(model, layers)
    return fast
