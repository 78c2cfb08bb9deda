"""The in-process torch trainer: one optimizer step on packed train rows.

fp32 master weights (optionally bf16 autocast for forward/backward), micro-batches with gradient
accumulation whose loss is normalised by the *whole* batch's token/row counts (so accumulation gives exactly
the full-batch gradient), optional gradient checkpointing and LoRA (peft), AdamW with warm-up and a
constant/linear/cosine schedule, grad-norm clipping. A non-finite loss or grad norm leaves the weights
untouched and raises TrainingError.

Micro-batches (SDPA models, i.e. all the built-in ones): rows packed end to end without padding, up to a token
budget (`micro_batch_tokens`), each row attending only to itself, lm_head applied to the trained positions only
and in chunks (see logprobs.py); the log-probs are scattered back into the padded [rows, positions] layout the
losses take, so every loss and aggregation sees the same tensors as before. Padding was ~20 % of the tokens
and the prompt/padding positions ~1/3 of the lm_head work on 8 × 4 × 64-token GRPO batches. Other attention
implementations keep padded micro-batches of --micro-batch-size rows.

A policy per role (`--roles`): the base weights are frozen and the model carries one LoRA adapter per name of
`adapter_names(config.roles)` (`shared` first). Each row trains the adapter of its role: micro-batches are split
by adapter (as by temperature) and each one's adapter is active for its forward/backward, so an adapter's
gradient comes from its own rows only, while all adapters take the same optimizer step (one loss normalisation,
one grad-norm clip over every adapter).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rllm_backends.local_torch.logprobs import (
    LOGPROB_CHUNK,
    collate,
    enable_packed_attention,
    pack_rows,
    packed_logprobs,
    sequence_logprobs,
)
from rllm_backends.local_torch.options import DEFAULT_MICRO_BATCH_TOKENS, LocalOptions
from rllm_backends.local_torch.packed_rows import MIN_SHARED_PREFIX, first_trained
from rllm_backends.local_torch.vision_rows import LORA_EXCLUDE, RowImages, freeze_vision
from rllm_core.errors import ConfigError, TrainingError
from rllm_serve.heap import release_free_memory
from rllm_serve.vision import is_vision_model
from rllm_train.algorithms import policy_loss_with_metrics
from rllm_train.algorithms.correction import correction_weights, mismatch_metrics, offpolicy_metrics
from rllm_train.backend import parse_backend_options
from rllm_train.config import TrainConfig
from rllm_train.packing import TrainRow
from rllm_train.roles import adapter_for_role, adapter_names

__all__ = ["MICRO_BATCH_TOKENS", "ROLE_LORA_RANK", "TorchTrainer", "check_device", "estimate_packed_bytes",
           "estimate_step_bytes", "micro_batch_tokens", "token_budget_batches"]

ROLE_LORA_RANK = 16
"""Rank of the per-role adapters when --roles is given without --lora-rank."""

_BATCH_NORMALISED = frozenset({"pg_loss", "kl"})
"""Micro-batch metrics divided by the whole batch's denominators (they add up); the rest are micro-batch means."""
_CORRECTION_MEANS = frozenset({"is_mean", "is_fraction_high", "is_fraction_low", "is_fraction_masked", "kl",
                               "k3_kl", "chi2_token"})
"""Off-policy correction metrics that are token means, so they average over micro-batches like the others."""

MICRO_BATCH_TOKENS = "micro_batch_tokens"
"""`backend_options` key (LocalOptions): tokens per packed micro-batch (default: --micro-batch-size ×
--max-seq-len, the most a padded micro-batch could hold, capped at DEFAULT_MICRO_BATCH_TOKENS)."""

_SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def estimate_step_bytes(model: torch.nn.Module, micro_batch: int, seq_len: int, checkpointing: bool) -> int:
    """Rough peak bytes of one micro-batch forward+backward: fp32 logits (×3: logits, log-softmax, grad) plus
    hidden activations (~20 tensors of [b, T, hidden] per layer, 2 with checkpointing)."""
    cfg = getattr(model, "config", None)
    vocab = int(getattr(cfg, "vocab_size", 32000))
    hidden = int(getattr(cfg, "hidden_size", 1024))
    layers = int(getattr(cfg, "num_hidden_layers", 12))
    per_layer = 2 if checkpointing else 20
    return 4 * micro_batch * seq_len * (3 * vocab + per_layer * layers * hidden)


def estimate_packed_bytes(model: torch.nn.Module, tokens: int, checkpointing: bool) -> int:
    """Rough peak bytes of one packed micro-batch: hidden activations per token (as `estimate_step_bytes`), the
    log-softmax kept for backward at each scored position (at most every token), and one chunk's logits and
    gradient (LOGPROB_CHUNK positions)."""
    cfg = getattr(model, "config", None)
    vocab = int(getattr(cfg, "vocab_size", 32000))
    hidden = int(getattr(cfg, "hidden_size", 1024))
    layers = int(getattr(cfg, "num_hidden_layers", 12))
    per_layer = 2 if checkpointing else 20
    return 4 * tokens * (vocab + per_layer * layers * hidden) + 8 * min(tokens, LOGPROB_CHUNK) * vocab


def micro_batch_tokens(config: TrainConfig) -> int:
    """The packed micro-batch's token budget: `backend_options["micro_batch_tokens"]`, else
    min(--micro-batch-size × --max-seq-len, DEFAULT_MICRO_BATCH_TOKENS)."""
    value = parse_backend_options(LocalOptions, config.backend_options, "local").micro_batch_tokens
    if value is None:
        return min(config.micro_batch_size * config.max_seq_len, DEFAULT_MICRO_BATCH_TOKENS)
    return value


def token_budget_batches(rows: Sequence[TrainRow], budget: int, key: Any) -> list[list[TrainRow]]:
    """Consecutive rows grouped into micro-batches of at most `budget` tokens, never mixing `key(row)` values
    (rows are sorted by it); a row longer than the budget is a micro-batch of its own. Every row lands in
    exactly one micro-batch, in order."""
    batches: list[list[TrainRow]] = []
    for part in _split_by(list(rows), key):
        current: list[TrainRow] = []
        size = 0
        for row in part:
            if current and size + len(row.tokens) > budget:
                batches.append(current)
                current, size = [], 0
            current.append(row)
            size += len(row.tokens)
        if current:
            batches.append(current)
    return batches


def _available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil
    except ImportError:  # not a declared dependency: fall back to the kernel's own estimate
        try:
            with open("/proc/meminfo") as f:
                fields = dict(line.split(":", 1) for line in f)
            return int(fields["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return 1 << 62  # unknown: do not refuse
    return int(psutil.virtual_memory().available)


def check_device(device: str) -> torch.device:
    """The torch device for `--device`, or a ConfigError that says what this machine has."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {device!r} asked for, but this torch sees no CUDA GPU: use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"--device {device!r}: this machine has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
    elif dev.type != "cpu":
        raise ConfigError(f"--device {device!r}: the local backend runs on cpu or one CUDA GPU")
    return dev


class TorchTrainer:
    """Owns the trainable model, its optimizer and schedule; `train_step(rows)` is one update."""

    def __init__(self, model: torch.nn.Module, config: TrainConfig, pad_token_id: int = 0, processor: Any = None,
                 train_vision: bool = False) -> None:
        self.config = config
        self.device = check_device(config.device)
        self.pad_token_id = pad_token_id
        model = model.to(device=self.device, dtype=torch.float32)
        if config.gradient_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5
                model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.vision = is_vision_model(model)
        """A vision-language model: rows' images go through its vision tower (vision_rows.py)."""
        if self.vision and not train_vision:
            freeze_vision(model)
        self.adapters: list[str] = adapter_names(config.roles)
        """The per-role LoRA adapters (`shared` first); [] without --roles."""
        self.lora = config.lora_rank > 0 or bool(self.adapters)
        if self.lora:
            model = _wrap_lora(model, config, self.adapters)
        self.model = model
        self.model.train()
        self.packed = enable_packed_attention(self.model)
        """Rows packed without padding (SDPA models); False: padded micro-batches of --micro-batch-size rows."""
        self.row_images = RowImages(processor, model, train_vision) if self.vision else None
        if self.vision and not self.packed:
            raise TrainingError(f"{type(model).__name__} cannot run the packed forward images are trained with "
                                "(its attention is not SDPA); load it with attn_implementation='sdpa'")
        self.token_budget = micro_batch_tokens(config)
        # KL to the starting policy: LoRA gets it for free (adapters off); full fine-tuning keeps a frozen copy.
        self.ref_model: torch.nn.Module | None = None
        if config.kl_coef > 0 and not self.lora:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        # Collected once, by name: peft's set_adapter turns requires_grad off on the inactive adapters, so a
        # `requires_grad` filter at step time would miss the adapters trained earlier in the same step.
        self.trainable: dict[str, torch.nn.Parameter] = {
            n: p for n, p in self.model.named_parameters() if p.requires_grad or (self.adapters and "lora_" in n)}
        # fused: one kernel over all parameters (the unfused CPU step took ~0.5 s of a ~22 s update on 135M)
        self.optimizer = torch.optim.AdamW(list(self.trainable.values()), lr=config.lr,
                                           weight_decay=config.weight_decay, fused=True)
        from transformers import get_scheduler

        self.scheduler = get_scheduler(_SCHEDULES[config.lr_schedule], self.optimizer,
                                       num_warmup_steps=config.warmup_steps,
                                       num_training_steps=max(config.max_steps, 1))
        self.step = 0

    @property
    def num_trainable_params(self) -> int:
        """Parameters the optimizer updates (every adapter's LoRA weights with --roles)."""
        return sum(p.numel() for p in self.trainable.values())

    def adapter_of(self, row: TrainRow) -> str | None:
        """The adapter `row` trains (its role's, by --roles); None without --roles."""
        return adapter_for_role(self.config.roles, row.role) if self.adapters else None

    def _activate(self, adapter: str | None) -> None:
        """Make `adapter` the one the forward pass uses (read from the model: a caller may have switched it)."""
        peft_model: Any = self.model
        if adapter is not None and peft_model.active_adapter != adapter:
            peft_model.set_adapter(adapter)

    # ------------------------------------------------------------------ one update
    def train_step(self, rows: Sequence[TrainRow]) -> dict[str, float]:
        """One optimizer step on `rows`; metrics: loss, pg_loss, clip_frac, approx_kl, entropy, grad_norm, lr,
        tokens_per_s. Raises TrainingError (weights untouched) when there is nothing to train or the loss
        is not finite."""
        cfg = self.config
        rows = [r for r in rows if any(r.loss_mask[1:])]
        if not rows:
            raise TrainingError("no trainable tokens in this batch (every row has loss mask 0); step skipped")
        started = time.perf_counter()
        # one adapter and one temperature per micro-batch (each row trains its role's adapter, scored at the
        # temperature it was sampled at); within it, padded rows sorted by length (less padding), packed rows
        # by their untrained prompt (a group's samples side by side: their shared prompt is packed once)
        rows = sorted(rows, key=self._row_order)
        # position 0 has no prefix to predict it from, so it can never be trained: not in the denominator
        token_denom = float(sum(sum(r.loss_mask[1:]) for r in rows))
        seq_denom = float(len(rows))
        mb = cfg.micro_batch_size
        if self.packed:
            chunks = token_budget_batches(rows, self.token_budget, self._micro_batch_key)
            big = max(chunks, key=lambda chunk: sum(len(r.tokens) for r in chunk))
            self.check_packed_memory(len(big), max(len(r.tokens) for r in big), sum(len(r.tokens) for r in big))
        else:
            self.check_memory(min(mb, len(rows)), max(len(r.tokens) for r in rows))
            chunks = [rows[i : i + mb] for i in range(0, len(rows), mb)]
            chunks = [part for chunk in chunks for part in _split_by(chunk, self._micro_batch_key)]
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        total_loss = 0.0
        total_tokens = 0
        for chunk in chunks:
            self._activate(self.adapter_of(chunk[0]))
            loss, metrics, n_tok = self._micro_step(chunk, token_denom, seq_denom)
            # what this micro-batch's forward and backward freed goes back to the OS before the next one: glibc
            # would keep it (sizes the next forward cannot reuse) on top of the gradients (-0.14 GiB at the peak)
            release_free_memory()
            if not math.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingError(f"loss is not finite ({loss}) at trainer step {self.step + 1}; weights were "
                                    "not updated. Check rewards for NaN, lower --lr, or try --no-bf16")
            total_loss += loss
            total_tokens += sum(len(r.tokens) for r in chunk)
            for k, v in metrics.items():  # pg_loss/kl are already shares of the whole batch; others are means
                sums[k] = sums.get(k, 0.0) + (v * token_denom if k in _BATCH_NORMALISED else v * n_tok)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(list(self.trainable.values()), cfg.max_grad_norm))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingError(f"gradient norm is not finite at trainer step {self.step + 1}; weights were not "
                                "updated. Lower --lr, or try --no-bf16")
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        elapsed = time.perf_counter() - started
        out = {f"train/{k}": v / token_denom for k, v in sums.items()}
        out.update({"train/loss": total_loss, "train/grad_norm": grad_norm, "train/lr": lr,
                    "train/rows": float(len(rows)), "train/trained_tokens": token_denom,
                    "train/tokens_per_s": total_tokens / max(elapsed, 1e-9), "time/train_step_s": elapsed})
        for adapter in self.adapters:
            mine = [r for r in rows if self.adapter_of(r) == adapter]
            out[f"train/adapter/{adapter}/rows"] = float(len(mine))
            out[f"train/adapter/{adapter}/trained_tokens"] = float(sum(sum(r.loss_mask[1:]) for r in mine))
        return out

    def _temperature(self, row: TrainRow) -> float:
        return row.temperature if row.temperature is not None else self.config.temperature

    def _row_order(self, row: TrainRow) -> tuple[Any, ...]:
        if self.packed:
            prompt = tuple(row.tokens[: first_trained(row.loss_mask)])
            return (*self._micro_batch_key(row), prompt, len(row.tokens))
        return (*self._micro_batch_key(row), len(row.tokens))

    def _micro_batch_key(self, row: TrainRow) -> tuple[str, float]:
        return self.adapter_of(row) or "", self._temperature(row)

    def _micro_step(self, chunk: Sequence[TrainRow], token_denom: float, seq_denom: float
                    ) -> tuple[float, dict[str, float], int]:
        cfg, dev = self.config, self.device
        temperature = self._temperature(chunk[0])
        start = max(1, min(r.loss_mask.index(1) for r in chunk))  # first trained position in the chunk
        mask_BT = collate([r.loss_mask for r in chunk], 0, torch.float32, dev)[:, start:]
        old_BT = collate([r.sampling_logprobs for r in chunk], 0.0, torch.float32, dev)[:, start:]
        adv_BT = collate([r.advantages for r in chunk], 0.0, torch.float32, dev)[:, start:]
        n_tokens = sum(len(r.tokens) for r in chunk)
        try:
            # no cast cache: a bf16 copy of every weight would live through forward and backward (~0.1 GiB on 135M);
            # with gradient checkpointing each weight is cast twice anyway, cached or not
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cfg.bf16, cache_enabled=False):
                logp_BT, ent_BT, ref_BT = (self._score_packed(chunk, start, temperature) if self.packed
                                           else self._score_padded(chunk, start, temperature))
                behaviour_BT = old_BT  # the sampler's: μ
                if cfg.recompute_old_logprobs:
                    old_BT = logp_BT.detach()
                elif all(r.old_logprobs is not None for r in chunk):  # π_old recomputed upstream of us
                    old_BT = collate([r.old_logprobs or [] for r in chunk], 0.0, torch.float32, dev)[:, start:]
                weights_BT, corr = None, {}
                if cfg.rollout_is != "none":  # off-policy correction (decoupled PPO with ppo): π_prox / μ
                    weights_BT, corr = correction_weights(old_BT.float() - behaviour_BT, mask_BT, cfg.rollout_is,
                                                          cfg.rollout_is_threshold)
                    corr = {f"rollout_corr/{k}": v for k, v in {
                        **corr, **offpolicy_metrics(old_BT.float(), behaviour_BT, mask_BT)}.items()
                        if k in _CORRECTION_MEANS}
                loss, metrics = policy_loss_with_metrics(
                    cfg.loss, logp_BT, old_BT, adv_BT, mask_BT, cfg.agg, cfg.clip_low, cfg.clip_high, cfg.clip_c,
                    ref_logprobs=ref_BT, kl_coef=cfg.kl_coef, kl_type=cfg.kl_type,
                    token_denominator=token_denom, seq_denominator=seq_denom, norm_tokens=cfg.max_tokens,
                    is_weights=weights_BT)
                metrics.update(corr)
                metrics.update(mismatch_metrics(logp_BT.detach().float(), behaviour_BT, mask_BT))
            if math.isfinite(float(loss.detach())):
                loss.backward()
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if "out of memory" not in str(exc) and "can't allocate" not in str(exc):
                raise
            width = max(len(r.tokens) for r in chunk)
            need = (estimate_packed_bytes(self.model, n_tokens, cfg.gradient_checkpointing) if self.packed
                    else estimate_step_bytes(self.model, len(chunk), width, cfg.gradient_checkpointing))
            lower = (f"backend_options.{MICRO_BATCH_TOKENS} (now {self.token_budget})" if self.packed
                     else "--micro-batch-size")
            raise TrainingError(
                f"out of memory on a micro-batch of {len(chunk)} rows, {n_tokens} tokens (estimated "
                f"{need / 2**30:.1f} GiB, {_available_bytes(dev) / 2**30:.1f} GiB free): lower {lower}, "
                "--max-seq-len or enable --gradient-checkpointing") from None
        n_tok = int(mask_BT.sum())
        assert ent_BT is not None
        metrics["entropy"] = float((ent_BT * mask_BT).sum() / max(n_tok, 1))
        return float(loss.detach()), metrics, n_tok

    def _score_padded(self, chunk: Sequence[TrainRow], start: int, temperature: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Log-probs, entropy and reference log-probs [B, T−start] from one right-padded forward."""
        dev = self.device
        ids_BT = collate([r.tokens for r in chunk], self.pad_token_id, torch.long, dev)
        attn_BT = collate([[1] * len(r.tokens) for r in chunk], 0, torch.long, dev)
        logp_BT, ent_BT = sequence_logprobs(self.model, ids_BT, attn_BT, temperature, with_entropy=True,
                                            start=start)
        assert ent_BT is not None
        ref_BT = None
        if self.config.kl_coef > 0:
            with torch.no_grad(), self._reference() as ref:
                ref_BT = sequence_logprobs(ref, ids_BT, attn_BT, temperature, start=start)[0]
        return logp_BT, ent_BT, ref_BT

    def _score_packed(self, chunk: Sequence[TrainRow], start: int, temperature: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The same tensors from one packed forward (no padding, lm_head on trained positions only, in chunks
        of LOGPROB_CHUNK), scattered into the [B, T−start] layout the loss takes (0 where nothing is trained)."""
        images = self.row_images.chunk(chunk) if self.row_images else None  # a VLM's rows: their images
        packed = pack_rows([r.tokens for r in chunk], [r.loss_mask for r in chunk], self.device,
                           min_shared=0 if any(r.images for r in chunk) else MIN_SHARED_PREFIX)  # features in row order
        shape = (len(chunk), max(len(r.tokens) for r in chunk) - start)
        where = (packed.row_K, packed.col_K - start)

        def scatter(values_K: torch.Tensor) -> torch.Tensor:
            return values_K.new_zeros(shape).index_put(where, values_K)

        vision = images.kwargs(self.model) if images else {}
        logp_K, ent_K = packed_logprobs(self.model, packed, temperature, with_entropy=True, chunk=LOGPROB_CHUNK,
                                        **vision)
        assert ent_K is not None
        ref_BT = None
        if self.config.kl_coef > 0:
            with torch.no_grad(), self._reference() as ref:
                ref_BT = scatter(packed_logprobs(ref, packed, temperature, **vision)[0])
        return scatter(logp_K), scatter(ent_K), ref_BT

    @contextlib.contextmanager
    def _reference(self) -> Iterator[torch.nn.Module]:
        """The starting policy: the frozen copy (full fine-tuning) or the model with its adapters off (LoRA)."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        with self.model.disable_adapter():  # type: ignore[operator]
            yield self.model

    def check_packed_memory(self, rows: int, longest: int, tokens: int) -> None:
        """Raise TrainingError, with the numbers, when a packed micro-batch (`rows` rows, the longest `longest`
        tokens, `tokens` in all) will not fit."""
        cfg = self.config
        need = estimate_packed_bytes(self.model, tokens, cfg.gradient_checkpointing)
        free = _available_bytes(self.device)
        if need <= free:
            return
        fits = int(tokens * free / need)
        lower = (f"backend_options.{MICRO_BATCH_TOKENS} (e.g. {max(1, fits)})" if MICRO_BATCH_TOKENS in
                 cfg.backend_options else f"--micro-batch-size (e.g. {max(1, min(rows, fits // cfg.max_seq_len))})")
        raise TrainingError(
            f"a micro-batch of {rows} rows × {longest} tokens needs about {need / 2**30:.1f} GiB but only "
            f"{free / 2**30:.1f} GiB is free on {self.device}: lower {lower}, --max-seq-len, or enable "
            "--gradient-checkpointing")

    def check_memory(self, micro_batch: int, seq_len: int) -> None:
        """Raise TrainingError, with the numbers, when a micro-batch of this shape will not fit."""
        need = estimate_step_bytes(self.model, micro_batch, seq_len, self.config.gradient_checkpointing)
        free = _available_bytes(self.device)
        if need > free:
            raise TrainingError(
                f"a micro-batch of {micro_batch} rows × {seq_len} tokens needs about {need / 2**30:.1f} GiB but "
                f"only {free / 2**30:.1f} GiB is free on {self.device}: lower --micro-batch-size (e.g. "
                f"{max(1, int(micro_batch * free / need))}), --max-seq-len, or enable --gradient-checkpointing")

    # ------------------------------------------------------------------ weights out, state in/out
    def serving_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (LoRA-merged) weights under the base model's names, for the policy server. With --roles only
        every adapter's LoRA tensors, unmerged, under the PeftModel's own names (`...lora_A.<adapter>.weight`):
        the server holds the same PeftModel and the frozen base never changes."""
        if self.adapters:
            return {k: v.detach() for k, v in self.model.state_dict().items() if "lora_" in k}
        if self.config.lora_rank <= 0:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        peft_model: Any = self.model
        peft_model.merge_adapter()
        try:
            base = peft_model.get_base_model().state_dict()
            return {k.replace(".base_layer", ""): v.detach().clone() for k, v in base.items() if "lora_" not in k}
        finally:
            peft_model.unmerge_adapter()

    def save(self, path: Path, tokenizer: Any = None, base_model: str | None = None, policy_version: int = 0
             ) -> None:
        """A model directory (checkpoint_io.py): save_pretrained weights or peft adapters (one per role with
        --roles), the tokenizer, and the optimizer/schedule/RNG state beside them."""
        from rllm_backends.local_torch.checkpoint_io import save_model_dir

        save_model_dir(self, Path(path), tokenizer, base_model, policy_version)

    def load(self, path: Path) -> None:
        """Restore from a checkpoint directory, or from an older run's `trainer.pt`."""
        from rllm_backends.local_torch.checkpoint_io import LEGACY_FILE, load_model_dir

        path = Path(path)
        if not any((path / f).exists() for f in (LEGACY_FILE, "model.safetensors", "adapter_model.safetensors",
                                                  "adapters")):
            raise TrainingError(f"checkpoint {path} holds no weights (model.safetensors, adapter_model.safetensors, "
                                "adapters/ or trainer.pt); it was not written by the local backend")
        load_model_dir(self, path)


def _wrap_lora(model: torch.nn.Module, config: TrainConfig, adapters: Sequence[str]) -> Any:
    """The PeftModel: one LoRA adapter (peft's "default") for --lora-rank, or one per name of `adapters` (--roles;
    rank --lora-rank, or ROLE_LORA_RANK when it is 0). LoRA B starts at zero: every adapter starts as the base."""
    from peft import LoraConfig, get_peft_model

    rank = config.lora_rank if config.lora_rank > 0 else ROLE_LORA_RANK
    lora = LoraConfig(r=rank, lora_alpha=config.lora_alpha, target_modules="all-linear", lora_dropout=0.0,
                      exclude_modules=LORA_EXCLUDE if is_vision_model(model) else None)
    names = list(adapters) or ["default"]
    with warnings.catch_warnings():  # peft probes transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model: Any = get_peft_model(model, lora, adapter_name=names[0])
        for name in names[1:]:
            peft_model.add_adapter(name, lora)
    if len(names) > 1:
        peft_model.set_adapter(names[0])
    return peft_model


def _split_by(rows: list[TrainRow], key: Any) -> list[list[TrainRow]]:
    """Consecutive runs of equal `key(row)` (rows are sorted by it already)."""
    parts: list[list[TrainRow]] = []
    for row in rows:
        if parts and key(parts[-1][-1]) == key(row):
            parts[-1].append(row)
        else:
            parts.append([row])
    return parts
