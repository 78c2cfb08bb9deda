"""The training loop, as a short list of stage calls:

    sample tasks → rollouts (n per task, through the gateway; the backend's before/after_rollouts around them;
    with --max-staleness K they run K steps ahead of the update: pipeline.py; stale trajectories dropped)
    → rewards → groups → rejection filter → advantages → pack → backend.train_step (may return a future: the
    step's episodes are written while the update runs) → backend.sync_weights → metrics → validate → checkpoint

Each stage is one function in this package returning `(output, metrics)`; this module only orders them,
times them, writes the run directory and shows progress. Errors from one episode never stop a run (the
engine records them); a step with nothing to train is skipped with its reason in metrics.jsonl; a training
error (NaN loss, out of memory) stops the run with the step number, keeping the last good checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from rllm_core.errors import ConfigError, TrainingError
from rllm_core.loggers import open_loggers
from rllm_core.types import Episode, Task, group_trajectories
from rllm_rollout.executor import RolloutExecutor
from rllm_rollout.rollout import Rollout
from rllm_train.algorithms import filter_groups, group_advantages
from rllm_train.backend import Backend, check_capabilities, check_images, create_backend, resolve_metrics
from rllm_train.checkpoints import clean_partial_checkpoints, latest_checkpoint, read_state, save_checkpoint
from rllm_train.config import TrainConfig, load_config
from rllm_train.display import TrainDisplay
from rllm_train.distill import Teacher, make_teacher, score_and_distill
from rllm_train.metrics import PhaseTimer, episode_metrics
from rllm_train.packing import pack_groups
from rllm_train.pipeline import RolloutPipeline, drop_stale, min_trained_version
from rllm_train.roles import check_recorded_roles, weigh_advantages
from rllm_train.rollouts import RolloutStage
from rllm_train.rundir import RunDir
from rllm_train.setup import (
    apply_benchmark_defaults,
    per_role_options,
    resolve_benchmark,
    resolve_init,
    resolve_rollout,
)

__all__ = ["TrainResult", "atrain", "sample_tasks", "train", "validation_settings"]

log = logging.getLogger("rllm.train")


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    last_checkpoint: Path | None
    history: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)


def sample_tasks(tasks: Sequence[Task], batch_size: int, seed: int, step: int) -> list[Task]:
    """Tasks of 1-based `step`: consecutive slices of per-epoch shuffles seeded by (seed, epoch), so a resumed
    run draws exactly the tasks the uninterrupted run would have."""
    if not tasks:
        raise ConfigError("the training split has no tasks; check --train-split / --data-dir")
    orders: dict[int, list[int]] = {}
    out: list[Task] = []
    start = (step - 1) * batch_size
    for pos in range(start, start + batch_size):
        epoch, idx = divmod(pos, len(tasks))
        if epoch not in orders:
            orders[epoch] = list(range(len(tasks)))
            random.Random(f"{seed}:{epoch}").shuffle(orders[epoch])
        out.append(tasks[orders[epoch][idx]])
    return out


@dataclass
class _Stages:
    """What every step needs, bound once: `train_step` and `validate` are the two things the loop repeats."""

    config: TrainConfig
    rollouts: RolloutStage
    backend: Backend
    run: RunDir
    train_tasks: Sequence[Task]
    val_tasks: list[Task]
    pipeline: RolloutPipeline
    teacher: Teacher | None = None
    """--teacher: scores each step's rows; its reverse KL joins the advantages (distill.py)."""
    trainer_version: int = 0
    """The policy version the trainer holds (what staleness is measured against)."""
    updated_unsaved: bool = False
    roles_checked: bool = False
    """Per-role options are checked against the roles the first step's episodes played (`check_recorded_roles`)."""
    """True between a step's update and its metrics being logged (a failure then leaves no clean state)."""

    async def train_step(self, step: int, display: TrainDisplay) -> dict[str, Any]:
        """sample → rollouts → rewards → groups → filter → advantages → pack → train → sync; metrics logged."""
        config, backend = self.config, self.backend
        timer = PhaseTimer()
        metrics: dict[str, Any] = {}
        self.updated_unsaved = False
        with timer("step"):
            display.phase(f"step {step}: rollouts")
            with timer("rollout"):  # with --max-staleness: only the wait for episodes started earlier
                episodes, _ = await self.pipeline.episodes(step)
            metrics.update(episode_metrics(episodes))
            if not self.roles_checked:  # the first step shows which roles the agent plays
                rollout = self.rollouts.rollout
                check_recorded_roles(episodes, per_role_options(config), f"agent {rollout.name!r}",
                                     declared=getattr(rollout, "roles", ()))
                self.roles_checked = True
            groups = group_trajectories(e for e in episodes if e.reward_reason not in UNKNOWN_REWARD)
            if config.max_staleness:
                groups, stale_metrics = drop_stale(groups, self.trainer_version, config.max_staleness,
                                                   config.stale_rows)
                metrics.update(stale_metrics)
            groups, filter_metrics = filter_groups(groups, config.rejection, episodes)
            metrics.update(filter_metrics)
            advantages = weigh_advantages(group_advantages(groups, config.algo), groups, config.role_weights)
            rows, pack_metrics = pack_groups(
                groups, advantages, max_tokens=config.max_seq_len, overlong=config.overlong,
                min_version=min_trained_version(self.trainer_version, config.max_staleness, config.stale_rows))
            metrics.update(pack_metrics)
            _warn_if_turns_split(pack_metrics)
            if self.teacher is not None and rows:
                with timer("teacher"):  # never through the gateway: no Steps, recorded apart (teacher.jsonl)
                    rows, distill_metrics = await asyncio.to_thread(
                        score_and_distill, self.teacher, rows, config.teacher_coef, config.task_coef)
                metrics.update(distill_metrics)
                self.run.log_teacher(step, {"teacher": self.teacher.name, **distill_metrics})
            if not any(r.num_trained_tokens for r in rows):
                metrics["skipped"] = _skip_reason(episodes, groups, rows)
                log.info("step %d skipped: %s", step, metrics["skipped"])  # the display prints it once
                self._save_episodes(step, episodes)
            else:
                check_images(rows, backend.capabilities(), backend.name)
                display.phase(f"step {step}: train on {len(rows)} rows")
                with timer("train"):
                    if config.max_staleness:  # a worker thread: the event loop drives the next steps' rollouts
                        update = await asyncio.to_thread(backend.train_step, rows)  # (even a submit that blocks)
                    else:
                        update = backend.train_step(rows)  # a remote backend returns at once: overlap our I/O
                    self._save_episodes(step, episodes)
                    metrics.update(await resolve_metrics(update))
                    self.updated_unsaved = True  # the weights moved: until this step is logged, no rescue save
                display.phase(f"step {step}: sync weights")
                with timer("sync"):  # with --max-staleness the next steps' rollouts go on meanwhile
                    metrics["policy_version"] = (await asyncio.to_thread(backend.sync_weights)
                                                 if config.max_staleness else backend.sync_weights())
                    self.trainer_version = int(metrics["policy_version"])
        metrics.update(timer.metrics())
        metrics["throughput/tokens_per_s"] = metrics.get("pack/tokens", 0.0) / max(metrics["time/step_s"], 1e-9)
        if config.rollout_workers:
            metrics.update({f"ray/{k}": float(v) for k, v in self.rollouts.ray_stats.items()})
        self.run.log("train", step, metrics)
        self.updated_unsaved = False
        return metrics

    def _save_episodes(self, step: int, episodes: list[Episode]) -> None:
        if self.config.save_episodes:
            self.run.save_episodes(f"step_{step}", episodes)

    async def validate(self, step: int, display: TrainDisplay) -> dict[str, Any]:
        """Held-out accuracy: sampled at the training temperature (eval_attempts per task), and greedy."""
        config = self.config
        display.phase(f"validating on {len(self.val_tasks)} held-out tasks")
        timer = PhaseTimer()
        metrics: dict[str, Any] = {}
        with timer("eval"):
            episodes = await self.rollouts.run(self.val_tasks, attempts=config.eval_attempts)
            metrics.update(episode_metrics(episodes, prefix="val/"))
            if config.eval_greedy:
                greedy = await self.rollouts.run(self.val_tasks, attempts=1, greedy=True)
                metrics.update(episode_metrics(greedy, prefix="val_greedy/"))
        metrics.update(timer.metrics())
        if config.save_episodes:
            self.run.save_episodes(f"eval_step_{step}", episodes)
            if config.eval_greedy:
                self.run.save_episodes(f"eval_greedy_step_{step}", greedy)
        self.run.log("eval", step, metrics)
        display.eval_done(step, metrics)
        return metrics


_FIXED_ON_RESUME = ("model", "lora_rank", "backend", "roles")
"""Options that decide the shape of the checkpointed weights: a resume cannot change them."""

_STREAM_ON_RESUME = ("batch_size", "group_size", "seed")
UNKNOWN_REWARD = ("judge_error",)
"""Reasons whose reward is unknown rather than low: those episodes are counted (episode/reason/...) but not
trained on, so a failing judge never teaches the policy that its answers scored 0."""
"""Options that decide what every step draws (its tasks, its attempts, the seeds they sample with): a resume that
changes them trains on something the uninterrupted run never would have, so it is refused unless
`--allow-resume-changes` says that is meant."""


def _changes(saved: TrainConfig, config: TrainConfig, names: Sequence[str]) -> list[str]:
    return [f"{k} {getattr(saved, k)!r} → {getattr(config, k)!r}" for k in names
            if getattr(saved, k) != getattr(config, k)]


def _check_resume_config(run: RunDir, config: TrainConfig) -> None:
    """Refuse, before anything loads or is written, a resume whose weights would not fit the run's checkpoints,
    that would not continue the run's task and sample stream (unless allowed), or that has no step left to run."""
    if not run.config_file.is_file():
        return
    saved = load_config(run.config_file)
    changed = _changes(saved, config, _FIXED_ON_RESUME)
    if changed:
        raise ConfigError(f"--resume {run.path}: its checkpoints were trained with other settings "
                          f"({', '.join(changed)}); drop those flags to resume, or start a new run with another "
                          "--output")
    stream = _changes(saved, config, _STREAM_ON_RESUME)
    if stream and not config.allow_resume_changes:
        raise ConfigError(f"--resume {run.path}: the run was sampled with other settings ({', '.join(stream)}), "
                          "so the resumed steps would not be the ones the run would have drawn; drop those flags "
                          "to continue it as it was, pass --allow-resume-changes to continue with them anyway, or "
                          "start a new run with another --output")
    if stream:
        log.warning("--resume %s with changed %s (--allow-resume-changes): the steps from here on draw other "
                    "tasks and samples than the run would have", run.path, ", ".join(stream))
    ckpt = latest_checkpoint(run.checkpoints_dir)
    done = int(read_state(ckpt).get("step", 0)) if ckpt is not None else 0
    if done >= config.max_steps:  # else the model loads, nothing trains, and config.yaml says max_steps went down
        raise ConfigError(f"--resume {run.path}: the run is already at step {done}, so --max-steps "
                          f"{config.max_steps} leaves nothing to train; pass --max-steps {done + 1} or more")


def _checkpoint_state(config: TrainConfig, metrics: dict[str, Any]) -> dict[str, Any]:
    """The loop's part of a checkpoint: what its random streams are derived from. Task order is a function of
    (seed, step) and every sampling seed of (seed, policy version, tasks, attempt, call), so these values are the
    whole RNG state; nothing in a training step draws from a global RNG (the models load with dropout off), so
    no generator state needs saving. batch_size and group_size are recorded with the seed they were drawn with."""
    return {"policy_version": metrics.get("policy_version"), "seed": config.seed, "batch_size": config.batch_size,
            "group_size": config.group_size}


def _resume(run: RunDir, backend: Backend) -> tuple[int, Path | None]:
    removed = clean_partial_checkpoints(run.checkpoints_dir)
    if removed:
        log.warning("removed %d partial checkpoint(s) left by an interrupted save", removed)
    ckpt = latest_checkpoint(run.checkpoints_dir)
    if ckpt is None:
        log.warning("no complete checkpoint in %s: starting from step 0", run.checkpoints_dir)
        run.truncate_metrics_after(-1)
        return 0, None
    backend.load(ckpt)
    step = int(read_state(ckpt)["step"])
    run.truncate_metrics_after(step)
    return step, ckpt


def validation_settings(config: TrainConfig, n_tasks: int) -> str:
    """What the held-out figures are measured under, in words: the training run's own sampling settings (a
    benchmark's short token cap included), which are not `rllm eval`'s, so a user compares like with like."""
    greedy = ", and greedy" if config.eval_greedy else ""
    attempts = "1 attempt" if config.eval_attempts == 1 else f"{config.eval_attempts} attempts"
    return (f"{n_tasks} {config.val_split} tasks, {attempts} each sampled at temperature {config.temperature:g}"
            f"{greedy}, ≤ {config.max_tokens} tokens per reply")


async def atrain(config: TrainConfig, *, backend: Backend | None = None, benchmark: Any = None,
                 rollout: Rollout | None = None, resume: bool = False, progress: bool = True,
                 console: Console | None = None, executor: RolloutExecutor | None = None) -> TrainResult:
    """Run (or resume) training as configured; see the module docstring for the stages.

    `backend`, `benchmark` and `rollout` replace the ones the config names (tests, benchmarks, notebooks);
    `executor` runs the episodes instead of where `rollout_workers` says (rllm_rollout.executor).
    `progress` shows the live bar; one line per step and per validation is printed to `console` either way
    (`Console(quiet=True)` for silence)."""
    if config.ray_address:  # an unreachable cluster fails in seconds, before data, run directory or model
        from rllm_rollout.distributed import check_ray_address

        check_ray_address(config.ray_address)
    config = resolve_init(config)  # a missing or empty run fails here, in one line
    benchmark = resolve_benchmark(config, benchmark)
    config, recommended = apply_benchmark_defaults(config, benchmark)
    console = console or Console()
    if recommended:
        shown = ", ".join(f"{k}={v}" for k, v in recommended.items())
        console.print(f"[dim]{config.benchmark}'s recommended settings: {shown} (a flag overrides them)[/dim]",
                      soft_wrap=True, highlight=False)
    rollout = rollout or resolve_rollout(config, benchmark)
    backend = backend or create_backend(config.backend, config)  # a missing SDK or API key fails before any data
    check_capabilities(config, backend.capabilities(), backend.name)  # before anything loads or is written
    train_tasks = benchmark.load(config.train_split, data_dir=config.data_dir,
                                 max_examples=config.max_train_examples, seed=config.seed)
    val_tasks = benchmark.load(config.val_split, data_dir=config.data_dir, max_examples=config.eval_examples,
                               seed=config.seed + 1) if config.eval_examples > 0 else []
    if val_tasks:
        console.print(f"[dim]validation: {validation_settings(config, len(val_tasks))}[/dim]", soft_wrap=True,
                      highlight=False)
    run = RunDir(config.output)
    if not resume and run.holds_run():
        raise ConfigError(f"{run.path} already holds a training run: continue it with `rllm train --resume "
                          f"{run.path}`, or pass another --output (or delete the directory)")
    if resume:
        _check_resume_config(run, config)  # before config.yaml is rewritten: a refused resume must not change it
    run.create()
    run.loggers = open_loggers(config.loggers, run.path, config)  # an unknown / missing logger fails here
    config.dump_yaml(run.config_file)
    result = TrainResult(run_dir=run.path, steps_done=0, last_checkpoint=None)
    stages: _Stages | None = None
    stage = RolloutStage(config, rollout, benchmark, backend, executor)
    stack = contextlib.ExitStack()
    run.start(max_steps=config.max_steps)  # run.json, heartbeat, log.txt: a monitor sees the run from here on
    failure: str | None = None
    try:
        stack.enter_context(stage)  # connects Ray first (with --rollout-workers): a bad address fails at once
        # a spinner (terminals only) for the seconds before the bar: loading weights, starting the server
        with console.status(f"loading {config.model} and starting its policy server…"):
            backend.setup(config)
            teacher = make_teacher(config.teacher, config.device) if config.teacher else None
            start = 0
            if resume:
                start, result.last_checkpoint = _resume(run, backend)
        result.steps_done = start
        async def step_rollouts(step: int) -> list[Episode]:
            tasks = sample_tasks(train_tasks, config.batch_size, config.seed, step)
            return await stage.run(tasks, attempts=config.group_size)

        pipeline = RolloutPipeline(step_rollouts, config.max_staleness, config.max_steps)
        stages = _Stages(config, stage, backend, run, train_tasks, val_tasks, pipeline, teacher,
                         trainer_version=backend.policy_endpoint().policy_version)
        with TrainDisplay(console, config.max_steps, start, bar=progress, echo=run.echo) as display:
            if start == 0 and val_tasks:
                result.evals.append(await stages.validate(0, display))
            budget_end = time.monotonic() + 60 * config.max_minutes if config.max_minutes else float("inf")
            for step in range(start + 1, config.max_steps + 1):
                metrics = await stages.train_step(step, display)
                result.history.append(metrics)
                result.steps_done = step
                display.step_done(step, metrics)
                last = step == config.max_steps or time.monotonic() > budget_end
                if config.eval_every and step % config.eval_every == 0 and not last and val_tasks:
                    result.evals.append(await stages.validate(step, display))
                if step % config.save_every == 0 or last:
                    display.phase(f"step {step}: checkpoint")
                    result.last_checkpoint = save_checkpoint(
                        run.checkpoints_dir, step, backend,
                        _checkpoint_state(config, metrics), keep=config.keep_checkpoints)
                if last:
                    break
            if result.steps_done > start and val_tasks:
                result.evals.append(await stages.validate(result.steps_done, display))
    except TrainingError as exc:
        run.log("error", result.steps_done + 1, {"error": str(exc)})  # so a monitor can say why the run stopped
        if stages is not None and not stages.updated_unsaved:
            _rescue_checkpoint(run, backend, config, result)
        where = result.last_checkpoint or latest_checkpoint(run.checkpoints_dir)
        keep = f"the last good checkpoint is {where}" if where else "no checkpoint was written yet"
        failure = (f"training stopped at step {result.steps_done + 1}: {exc}. {keep}; resume with "
                   f"`rllm train --resume {run.path}` after fixing the cause")
        raise TrainingError(failure) from None
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C reaches a coroutine as a cancellation
        failure = "interrupted"
        raise
    except BaseException as exc:
        failure = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if stages is not None:  # episodes started for steps that will not train: cancelled, never written
            await stages.pipeline.close()
            if stages.teacher is not None:
                stages.teacher.close()
        try:
            backend.shutdown()  # before the stage: a backend's actors live on the Ray the stage may own
            stack.close()
        finally:
            run.loggers.close()
            run.stop(failure)  # heartbeat "finished", or "failed" with why
    return result


def _rescue_checkpoint(run: RunDir, backend: Backend, config: TrainConfig, result: TrainResult) -> None:
    """After a failed step (weights untouched, as the seam promises), checkpoint the last completed step if it
    has none yet, so `--resume` loses no finished step. A backend that cannot save now (its service is down)
    leaves the older checkpoint in place."""
    if result.steps_done == 0 or not result.history:
        return
    saved = result.last_checkpoint or latest_checkpoint(run.checkpoints_dir)
    if saved is not None and int(read_state(saved)["step"]) >= result.steps_done:
        return
    try:
        result.last_checkpoint = save_checkpoint(run.checkpoints_dir, result.steps_done, backend,
                                                 _checkpoint_state(config, result.history[-1]),
                                                 keep=config.keep_checkpoints)
    except Exception as exc:  # a rescue must never hide the error that stopped the run
        log.warning("could not checkpoint step %d after the failure: %s", result.steps_done, exc)


SPLIT_WARN_RATE = 0.05
"""Share of multi-turn steps that had to start a new row, above which the run says so (once)."""
_warned_split = False


def _warn_if_turns_split(pack_metrics: dict[str, float]) -> None:
    """Say once per process when many turns broke the prefix: each split row repeats the whole history (compute
    grows with the square of the turns, seq-mean losses count the trajectory twice). The rate is logged every step
    as pack/rows_split / pack/steps_used."""
    global _warned_split
    used, split = pack_metrics.get("pack/steps_used", 0.0), pack_metrics.get("pack/rows_split", 0.0)
    if _warned_split or not used or split / used <= SPLIT_WARN_RATE:
        return
    _warned_split = True
    log.warning("%d of %d LLM calls did not extend the previous turn's tokens and started a new train row (the "
                "agent rewrote its history, or the upstream re-tokenized it): serve the policy with rllm's policy "
                "server (exact turns) or keep the agent's history unchanged; see docs/gateway.md", split, used)


def _skip_reason(episodes: list[Episode], groups: list[Any], rows: list[Any]) -> str:
    unknown = [e for e in episodes if e.reward_reason in UNKNOWN_REWARD]
    if episodes and len(unknown) == len(episodes):
        first = (unknown[0].artifacts.get("grading") or {}).get("details", {}).get("judge_error", "")
        return f"no episode has a known reward: all {len(episodes)} are {unknown[0].reward_reason} ({first})"
    steps = [s for e in episodes for s in e.steps]
    if not steps:
        errors = sum(1 for e in episodes if e.error is not None)
        why = f"; {errors} of {len(episodes)} episodes errored (see episodes/*.jsonl)" if errors else ""
        return f"no LLM calls were recorded (did the agent use config.base_url?){why}"
    if not any(s.trainable for s in steps):
        errored = sum(1 for s in steps if s.error is not None)
        no_ids = sum(1 for s in steps if s.error is None and s.token_source == "none")
        no_lps = len(steps) - errored - no_ids
        return (f"no trainable steps among {len(steps)} LLM calls: {errored} errored, {no_ids} without token ids "
                f"(upstream without return_token_ids and no tokenizer to retokenize), {no_lps} without logprobs "
                "(e.g. retokenized replies; request logprobs from the upstream)")
    if not groups:
        return "rejection sampling dropped every group (all rewards in each group were equal)"
    return f"no row kept a trained token ({len(rows)} rows; over-long rows dropped?)"


def train(config: TrainConfig, **kwargs: Any) -> TrainResult:
    """Synchronous `atrain` (not from inside a running event loop)."""
    return asyncio.run(atrain(config, **kwargs))
