"""A trained Llama-family model as one GGUF file, for llama.cpp and Ollama (f32, f16 or bf16).

Written with the `gguf` package's `GGUFWriter` (llama.cpp's own Python writer: the key names, tensor names and
file layout are its, not ours). What llama.cpp's converter adds on top, done here the same way: the llama
metadata from the HF config; the byte-level BPE tokenizer ("gpt2": tokens by id, token types, merges, special
ids, the chat template); the tensor names (`blk.N.attn_q`, ...); and Q/K rows permuted from HF's rotary layout
(rotate-half) to GGML's (interleaved pairs). `tests/test_export.py` loads the file back the way the embedded
model is loaded (transformers + gguf) and compares logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rllm_core.errors import ConfigError

__all__ = ["SUPPORTED_ARCHITECTURES", "write_gguf"]

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
_DTYPES = {"float32": (np.float32, "ALL_F32"), "float16": (np.float16, "MOSTLY_F16"),
           "bfloat16": (None, "MOSTLY_BF16")}


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF's q/k projection rows (each head: first halves, then second halves of the rotary pairs) in GGML's
    order (pairs interleaved), as llama.cpp's LlamaModel.permute does."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model: Any) -> list[tuple[str, torch.Tensor]]:
    cfg = model.config
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    heads, kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads or cfg.num_attention_heads)
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(int(cfg.num_hidden_layers)):
        p = f"model.layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"]),
            (f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], heads)),
            (f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], kv_heads)),
            (f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"]),
            (f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"]),
            (f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]),
            (f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]),
            (f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"]),
            (f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"]),
        ]
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    if not getattr(cfg, "tie_word_embeddings", False):
        out.append(("output.weight", sd["lm_head.weight"]))
    return out


def _vocab(tokenizer: Any) -> tuple[list[str], list[int], list[str]]:
    """Tokens by id, their GGUF types (1 normal, 3 control, 4 user-defined) and the BPE merges, read from the
    fast tokenizer's own serialization (the exact merges the model was trained with)."""
    import gguf

    data = json.loads(tokenizer.backend_tokenizer.to_str())
    model = data.get("model", {})
    if model.get("type") != "BPE":
        raise ConfigError(f"GGUF export writes byte-level BPE tokenizers only; this one is {model.get('type')!r}")
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    by_id = {i: t for t, i in vocab.items()}
    added = {a["id"]: a for a in data.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(size):
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        if i in added:
            types.append(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, [int(t) for t in types], merges


def write_gguf(model: Any, tokenizer: Any, path: Path, dtype: str = "float32", name: str = "rllm export",
               pre_tokenizer: str = "smollm") -> Path:
    """Write `model` (a transformers LlamaForCausalLM) and `tokenizer` as the GGUF file `path`."""
    import gguf

    arch = type(model).__name__
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"GGUF export supports {', '.join(SUPPORTED_ARCHITECTURES)} (the Llama family this "
                          f"project embeds); this model is {arch}: export --format hf and convert it with "
                          "llama.cpp's convert_hf_to_gguf.py")
    if dtype not in _DTYPES:
        raise ConfigError(f"--dtype {dtype!r} for GGUF: use one of {', '.join(_DTYPES)}")
    np_dtype, file_type = _DTYPES[dtype]
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(int(cfg.max_position_embeddings))
    writer.add_embedding_length(int(cfg.hidden_size))
    writer.add_block_count(int(cfg.num_hidden_layers))
    writer.add_feed_forward_length(int(cfg.intermediate_size))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(cfg.num_key_value_heads or heads))
    writer.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or _rope_theta(cfg)))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    writer.add_rope_dimension_count(int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads))
    writer.add_vocab_size(int(cfg.vocab_size))
    writer.add_file_type(int(getattr(gguf.LlamaFileType, file_type)))
    tokens, types, merges = _vocab(tokenizer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, setter in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                        ("pad_token_id", writer.add_pad_token_id), ("unk_token_id", writer.add_unk_token_id)):
        value = getattr(tokenizer, key, None)
        if value is not None:
            setter(int(value))
    writer.add_add_bos_token(False)
    if getattr(tokenizer, "chat_template", None):
        writer.add_chat_template(tokenizer.chat_template)
    for tensor_name, value in _tensors(model):
        if value.ndim == 1 or np_dtype is np.float32:  # norms stay f32, as llama.cpp writes them
            writer.add_tensor(tensor_name, value.numpy().astype(np.float32))
        elif np_dtype is None:  # bf16: the raw 16 bits, typed as such
            raw = value.to(torch.bfloat16).view(torch.int16).numpy()
            writer.add_tensor(tensor_name, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(tensor_name, value.numpy().astype(np_dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _rope_theta(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", 10000.0)) if isinstance(params, dict) else 10000.0
