"""`rllm sft`: supervised fine-tuning on the run directory, backends, checkpoints and monitor of `rllm train`.

RL reinforces what a policy already does sometimes; where it never succeeds there is nothing to reinforce. SFT
starts it: on curated episodes (eval → curate → SFT, as rLLM's `rllm sft`), on chat data, and on reference
solutions turned into trajectories. Rows come from `sft_data` packed exactly as RL rows (multi-turn trajectories
one row, observations masked); the backend trains them with `--loss sft` (−A·logπ with A = 1 on assistant
tokens: the negative log-likelihood), full fine-tune or LoRA, and each checkpoint is a model directory that
`rllm train --init RUN`, `rllm eval --model RUN`, `rllm serve` and `rllm export` take.

    sample a batch of rows (a seeded shuffle per epoch) → backend.train_step → metrics → checkpoint

The backend's policy server is started as in training (the local backend serves the weights it trains), so a
checkpoint is the same artefact whichever command wrote it. A backend without `sft` among its losses refuses by
name before anything loads.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from rllm_core.errors import ConfigError, TrainingError
from rllm_core.loggers import open_loggers
from rllm_train.backend import Backend, check_capabilities, create_backend, resolve_metrics
from rllm_train.checkpoints import save_checkpoint
from rllm_train.config import TrainConfig
from rllm_train.display import TrainDisplay
from rllm_train.packing import OverlongRule, TrainRow
from rllm_train.rundir import RunDir
from rllm_train.sft_data import EpisodeFilter, eos_ids, sft_rows_from_chat, sft_rows_from_episodes

__all__ = ["SftConfig", "SftResult", "load_sft_rows", "sft", "sft_batches"]


class SftConfig(BaseModel):
    """Everything `rllm sft` needs (the CLI's flags)."""

    model_config = ConfigDict(extra="forbid")

    data: list[str]
    """Runs of rllm train / rllm eval, episodes .jsonl files, or chat .jsonl files ({"messages": [...]})."""
    model: str = "smollm2-135m"
    backend: str = "local"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    device: str = "cpu"
    lora_rank: int = Field(0, ge=0)
    lora_alpha: int = 16
    roles: str | dict[str, str] = Field(default_factory=dict)
    """A LoRA adapter per role, 'solver=lora:solver,judge=lora:judge' (as `rllm train --roles`): each row trains
    its trajectory's role's adapter."""
    bf16: bool = True
    gradient_checkpointing: bool = False
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many steps (default: every row, `epochs` times)."""
    batch_size: int = Field(8, ge=1)
    """Rows per optimizer step."""
    micro_batch_size: int = Field(8, ge=1)
    max_seq_len: int = Field(2048, ge=8)
    overlong: OverlongRule = "truncate"
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: str = "constant"
    max_grad_norm: float = Field(1.0, gt=0)
    seed: int = 0
    output: str = "runs/sft"
    save_every: int = Field(0, ge=0)
    """Checkpoint every N steps as well as at the end (0: at the end only)."""
    keep_checkpoints: int = Field(2, ge=0)
    loggers: list[str] = Field(default_factory=list)
    keep: EpisodeFilter = Field(default_factory=EpisodeFilter)
    """Which episodes a run or episodes file contributes (chat data is taken whole)."""

    def train_config(self, max_steps: int) -> TrainConfig:
        """The TrainConfig a backend is set up with: `--loss sft`, token-mean, temperature 1, no rollouts."""
        return TrainConfig(
            benchmark="sft", model=self.model, backend=self.backend, backend_options=self.backend_options,
            device=self.device, lora_rank=self.lora_rank, lora_alpha=self.lora_alpha, roles=self.roles, bf16=self.bf16,
            gradient_checkpointing=self.gradient_checkpointing, loss="sft", agg="token-mean", algo="reinforce",
            group_size=1, batch_size=self.batch_size, micro_batch_size=self.micro_batch_size,
            max_seq_len=self.max_seq_len, overlong=self.overlong, temperature=1.0, lr=self.lr,
            weight_decay=self.weight_decay, warmup_steps=self.warmup_steps, lr_schedule=self.lr_schedule,
            max_grad_norm=self.max_grad_norm, max_steps=max_steps, seed=self.seed, output=self.output,
            eval_examples=0, save_every=max(self.save_every or max_steps, 1), keep_checkpoints=self.keep_checkpoints,
            save_episodes=False, loggers=self.loggers)


@dataclass
class SftResult:
    run_dir: Path
    steps_done: int
    last_checkpoint: Path | None
    counts: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def _is_chat_file(path: Path) -> bool:
    """A .jsonl whose first readable line has `messages` and no `trajectories` (an episode has trajectories)."""
    if not path.is_file():
        return False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return False
                return isinstance(first, dict) and "messages" in first and "trajectories" not in first
    return False


def _tokenizer(model: str) -> Any:
    from rllm_serve.models import load_tokenizer
    from rllm_serve.run_model import resolve_checkpoint

    ckpt = resolve_checkpoint(model)
    return load_tokenizer(str(ckpt) if ckpt is not None else model)


def _processor(model: str) -> Any:
    from rllm_serve.models import load_processor
    from rllm_serve.run_model import resolve_checkpoint

    ckpt = resolve_checkpoint(model)
    return load_processor(str(ckpt) if ckpt is not None else model)


def load_sft_rows(config: SftConfig) -> tuple[list[TrainRow], dict[str, float]]:
    """Every source's rows, and the counts of what was read, kept and skipped (summed over sources)."""
    rows: list[TrainRow] = []
    counts: dict[str, float] = {}
    tokenizer = functools.cache(lambda: _tokenizer(config.model))  # once, and only for data that needs rendering
    processor = functools.cache(lambda: _processor(config.model))  # a vision-language model's, for calls with images

    for spec in config.data:
        source = Path(spec).expanduser()
        if _is_chat_file(source):
            got, seen = sft_rows_from_chat(source, tokenizer(), end_of_turn_ids=eos_ids(tokenizer()),
                                           max_seq_len=config.max_seq_len, overlong=config.overlong)
        else:
            got, seen = sft_rows_from_episodes(source, config.keep, max_seq_len=config.max_seq_len,
                                               overlong=config.overlong, tokenizer=tokenizer, processor=processor)
        rows += got
        for key, value in seen.items():
            counts[key] = counts.get(key, 0.0) + value
    counts["rows"] = float(len(rows))
    counts["trained_tokens"] = float(sum(r.num_trained_tokens for r in rows))
    return rows, counts


def sft_batches(rows: list[TrainRow], batch_size: int, seed: int, step: int) -> list[TrainRow]:
    """Rows of 1-based `step`: consecutive slices of a per-epoch shuffle seeded by (seed, epoch); an epoch's last
    batch may be short (no row is repeated or skipped within an epoch)."""
    per_epoch = math.ceil(len(rows) / batch_size)
    epoch, index = divmod(step - 1, per_epoch)
    order = list(range(len(rows)))
    random.Random(f"sft:{seed}:{epoch}").shuffle(order)
    return [rows[i] for i in order[index * batch_size: (index + 1) * batch_size]]


def _no_rows(counts: dict[str, float], config: SftConfig) -> str:
    read, kept = counts.get("episodes_read", 0), counts.get("episodes_kept", 0)
    if read and not kept:
        return f"no episode of the {read:.0f} read passed the filters; loosen --min-reward / --reason / --where"
    if kept and not counts.get("steps_used"):
        return (f"the {kept:.0f} kept episodes have no trainable steps (no token ids or logprobs recorded): "
                "record them through rllm's gateway or policy server")
    return f"no trainable rows in {', '.join(config.data)}"


async def asft(config: SftConfig, *, backend: Backend | None = None, progress: bool = True,
               console: Console | None = None) -> SftResult:
    """Run SFT as configured (module docstring)."""
    console = console or Console()
    rows, counts = load_sft_rows(config)  # bad data fails before a model loads
    if not rows:
        raise ConfigError(_no_rows(counts, config))
    per_epoch = math.ceil(len(rows) / config.batch_size)
    max_steps = min(per_epoch * config.epochs, config.max_steps or per_epoch * config.epochs)
    train_config = config.train_config(max_steps)
    backend = backend or create_backend(train_config.backend, train_config)
    check_capabilities(train_config, backend.capabilities(), backend.name)
    shown = "  ".join(f"{k} {v:g}" for k, v in counts.items() if v)
    console.print(f"[dim]sft data: {shown}; {max_steps} steps of {config.batch_size} rows[/dim]", soft_wrap=True,
                  highlight=False)
    run = RunDir(config.output)
    if run.holds_run():
        raise ConfigError(f"{run.path} already holds a run: pass another --output (or delete the directory)")
    run.create()
    run.loggers = open_loggers(train_config.loggers, run.path, train_config)
    train_config.dump_yaml(run.config_file)
    result = SftResult(run_dir=run.path, steps_done=0, last_checkpoint=None, counts=counts)
    run.start(max_steps=max_steps)
    failure: str | None = None
    try:
        with console.status(f"loading {config.model}…"):
            backend.setup(train_config)
        with TrainDisplay(console, max_steps, 0, bar=progress, echo=run.echo) as display:
            for step in range(1, max_steps + 1):
                display.phase(f"step {step}: train")
                metrics = dict(await resolve_metrics(backend.train_step(sft_batches(rows, config.batch_size,
                                                                                    config.seed, step))))
                metrics["sft/epoch"] = float((step - 1) // per_epoch + 1)
                metrics["policy_version"] = backend.sync_weights()
                run.log("train", step, metrics)
                result.history.append(metrics)
                result.steps_done = step
                display.step_done(step, metrics)
                if step == max_steps or (config.save_every and step % config.save_every == 0):
                    display.phase(f"step {step}: checkpoint")
                    result.last_checkpoint = save_checkpoint(
                        run.checkpoints_dir, step, backend, {"policy_version": metrics["policy_version"],
                                                             "seed": config.seed, "sft": True},
                        keep=config.keep_checkpoints)
    except TrainingError as exc:
        failure = f"sft stopped at step {result.steps_done + 1}: {exc}"
        run.log("error", result.steps_done + 1, {"error": str(exc)})
        raise TrainingError(failure) from None
    except BaseException as exc:
        failure = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        try:
            backend.shutdown()
        finally:
            run.loggers.close()
            run.stop(failure)
    return result


def sft(config: SftConfig, **kwargs: Any) -> SftResult:
    """Synchronous `asft` (not from inside a running event loop)."""
    return asyncio.run(asft(config, **kwargs))
