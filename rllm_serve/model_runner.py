"""The engine's model runner: the served weights and the passes over them.

It holds the model (and, with `swap_mode="finish"`, copies of older versions still finishing their requests),
its linear layers on packed weights (packed_linear.py), and runs one step's forward pass per policy version
(batch-invariant while a seeded request is in it, on CPU) and the sampling of the rows whose feed reached its
end. Weight swaps and releases happen here too; when and for which work is the engine's call (engine.py).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import torch

from rllm_core.errors import ConfigError
from rllm_serve.fast_forward import fusions
from rllm_serve.invariant import batch_invariant, make_batch_invariant
from rllm_serve.kv_pool import KVPool
from rllm_serve.models import BASE_ADAPTER, LoadedModel, lora_adapters
from rllm_serve.packed_linear import PackedLayers, pack_linear_layers, packs_released, release_packed
from rllm_serve.paged_attention import PAGED_ATTENTION
from rllm_serve.sampling import SamplingParams, sample_tokens, scaled_logprobs, top_logprobs_batch
from rllm_serve.step import run_forward
from rllm_serve.vision import is_vision_model, uses_mrope
from rllm_serve.work import Work

__all__ = ["ModelRunner"]

log = logging.getLogger("rllm.serving.engine")


class ModelRunner:
    """The model, its packed layers, older versions in use, and the forward pass and sampling of a step."""

    def __init__(self, loaded: LoadedModel, own_model: bool = False) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = next(self.model.parameters()).device
        self.vocab = int(self.model.get_input_embeddings().num_embeddings)
        self.adapters: tuple[str, ...] = tuple(lora_adapters(self.model))
        """LoRA adapters requests can name (peft model); () for a plain model."""
        self.vision = is_vision_model(self.model)
        """A vision-language model: its image features go into the prompt's embedding rows (step.py)."""
        self.mrope = self.vision and uses_mrope(self.model)
        """Its decoder takes 3-D rotary positions (Qwen2-VL)."""
        try:  # a vision model's tower keeps its own attention: only the text decoder reads the paged KV
            self.model.set_attn_implementation({"text_config": PAGED_ATTENTION} if self.vision else PAGED_ATTENTION)
        except (AttributeError, ValueError) as exc:
            raise ConfigError(f"the policy server cannot serve {loaded.name!r}: its transformers class does not "
                              f"take a custom attention implementation ({exc})") from None
        self.batch_invariant = self.device.type == "cpu" and make_batch_invariant(self.model)
        self.own_model = own_model
        """The runner may release the dense weights it packed (nobody else uses this model object)."""
        self.packed = PackedLayers()
        """Linear layers on packed weights (packed on the engine thread, at its start)."""
        self.old_models: dict[int, Any] = {}
        """Earlier policy versions still finishing their requests (swap_mode="finish")."""
        self.released = False
        """Packed weights dropped (`release`) until an update brings every weight back: nothing can run."""

    def pack(self, max_rows: int, kernel: bool) -> None:
        """Pack the linear layers for batches of up to `max_rows` (batch-invariant CPU serving only)."""
        if not self.batch_invariant:
            return
        try:
            self.packed = pack_linear_layers(self.model, max_rows, self.own_model,
                                             fusions(self.model) if kernel else None)
        except Exception:  # the plain padded path still serves
            log.exception("packing the linear layers failed; serving with F.linear")

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def swap(self, state_dict: Mapping[str, torch.Tensor], current: list[Work], policy_version: int,
             keep_old: bool, pool: KVPool) -> None:
        """Serve `state_dict` from now on. `current`: the work on the weights being replaced; with `keep_old` a
        copy of those weights keeps serving it, else its KV is dropped (prefilled again on the new weights)."""
        own = self.model.state_dict()
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            hint = ("pass model.state_dict() of the same architecture" if not self.adapters else
                    "pass (a subset of) the PeftModel's own state_dict(), whose LoRA keys name their adapter "
                    f"('...lora_A.<adapter>.weight', adapters here: {list(self.adapters)}); "
                    "get_peft_model_state_dict() drops the adapter name")
            raise ConfigError(f"update_weights: {len(unknown)} keys are not parameters of the served model "
                              f"(first: {unknown[:3]}); {hint}")
        for k, v in state_dict.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ConfigError(f"update_weights: {k} has shape {tuple(v.shape)}, "
                                  f"the served model expects {tuple(own[k].shape)}")
            if v.is_meta or v.is_floating_point() != own[k].is_floating_point():
                raise ConfigError(f"update_weights: {k} is a {'meta' if v.is_meta else str(v.dtype)} tensor; pass "
                                  f"real {own[k].dtype} values (a model loaded on the meta device has none)")
        if self.released and (missing := [k for k in self.packed.by_name if k not in state_dict]):
            raise ConfigError(f"update_weights after release_weights must bring every weight back; {len(missing)} "
                              f"packed weights are missing (first: {missing[0]}); pass the model's full state_dict")
        if current and keep_old:  # a copy of the old weights serves the requests in flight
            self.old_models[policy_version] = copy.deepcopy(self.model)
        elif current:  # resume: their KV is stale; they prefill their text again under the new weights
            for w in current:
                w.drop_kv(pool)
        try:
            for k, v in state_dict.items():
                self.packed.update(k, own[k], v)  # packed anew: an old model copy keeps the old ones
            self.packed.finish()
        finally:
            self.packed.discard()
        pool.clear_cache()
        if self.released:  # weights dropped by release: served again once none is missing
            self.released = packs_released(self.packed) > 0

    def release(self, pool: KVPool) -> bool:
        """Drop the packed weights and the idle KV pool's pages (the caller checked nothing runs); whether any
        weights were dropped (a plain or adapter model has none to drop)."""
        if not len(self.packed) or self.adapters:
            return False
        pool.drop_pages()  # no block is in use: the KV pool's pages go too
        self.released = release_packed(self.packed) > 0 or self.released
        return self.released

    def retire_version(self, version: int) -> None:
        """Free an older version's weights: its last request ended."""
        self.old_models.pop(version, None)

    # ------------------------------------------------------------------ a step
    def refresh(self) -> None:
        """Re-pack weights a model passed in had changed in place by its owner (once per engine step)."""
        self.packed.refresh()

    def forward(self, pool: KVPool, items: list[tuple[Work, int]], version: int, current: int) -> torch.Tensor:
        """Feed the items (all of policy `version`; `current` is the newest) and return their sampled rows'
        fp32 logits [K, V]: one row per item whose feed reached its end."""
        model = self.model if version == current else self.old_models.get(version, self.model)
        seeded = self.batch_invariant and any(w.request.params.seed is not None for w, _ in items)
        with batch_invariant(seeded):
            return run_forward(model, pool, items, bool(self.adapters), BASE_ADAPTER, self.vision, self.mrope)

    def sample(self, logits_KV: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
               ) -> tuple[list[int], list[float], list[Any]]:
        """Each row's next token, its logprob and its top logprobs, under that row's sampling parameters."""
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=logits_KV.device)
        logprobs_BV = scaled_logprobs(logits_KV, temps)
        next_B = sample_tokens(logprobs_BV, params, generators)
        chosen = logprobs_BV.gather(1, next_B[:, None])[:, 0].tolist()
        tops = top_logprobs_batch(logprobs_BV, [p.top_logprobs for p in params])
        return next_B.tolist(), chosen, tops
