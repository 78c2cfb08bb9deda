"""`rllm train`: the CLI face of the training loop.

Every TrainConfig field is a flag of the same name (`group_size` → `--group-size`), generated from the
config model so the CLI, YAML/TOML files and the Python API can never drift apart. Precedence: the run
directory's config.yaml (with --resume) < --config file < flags.
"""

from __future__ import annotations

import inspect
import shlex
import types
import typing
from pathlib import Path
from typing import Any, Literal

import typer
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import ConfigError, RLLMError
from rllm_core.hookspecs import hookimpl
from rllm_train.config import TrainConfig, load_config, load_run_config

__all__ = ["rllm_register_commands", "train_command"]


def _cli_type(annotation: Any) -> Any:
    """The scalar type typer should parse for a config field (Literal → str, X | None → X, str | dict → str)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return str
    if origin in (typing.Union, types.UnionType):
        return _cli_type(args[0])
    return annotation if annotation in (str, int, float, bool) else str


_PANELS: dict[str, tuple[str, ...]] = {
    "What to train on": ("agent", "harness", "workflow", "sandbox", "train_split", "val_split", "data_dir",
                         "max_train_examples"),
    "Reward": ("reward", "judge", "rubric"),
    "Model and backend": ("model", "init", "backend", "device", "n_gpus", "nnodes", "bf16", "gradient_checkpointing",
                          "lora_rank", "lora_alpha"),
    "Algorithm": ("algo", "role_weights", "roles", "loss", "agg", "clip_low", "clip_high", "clip_c", "kl_coef",
                  "kl_type", "rejection", "recompute_old_logprobs"),
    "Distillation": ("teacher", "teacher_coef", "task_coef"),
    "Asynchronous and off-policy": ("max_staleness", "stale_rows", "rollout_is", "rollout_is_threshold"),
    "Batch and sampling": ("group_size", "batch_size", "micro_batch_size", "max_seq_len", "overlong", "temperature",
                           "top_p", "max_tokens", "concurrency", "episode_timeout_s"),
    "Distributed (Ray)": ("rollout_workers", "ray_address", "gateway"),
    "Optimizer": ("lr", "weight_decay", "warmup_steps", "lr_schedule", "max_grad_norm"),
    "On disk": ("output", "save_every", "keep_checkpoints", "save_episodes"),
}
"""Help panels of `rllm train --help`: some 50 options in one table are hard to scan, and one table takes the
width of its longest flag for every row. Options not listed land in "Run, validation and checkpoints"."""


_ALIASES: dict[str, tuple[str, ...]] = {"algo": ("--estimator",)}
"""Second flag names: `--estimator solver=grpo,judge=reinforce` reads better for a per-role map than --algo."""

_MAP_FLAGS = ("role_weights", "roles")
"""Mapping options that also have a flag, written `role=value,role=value` (other mappings: config files only)."""


def _panel(name: str) -> str:
    return next((title for title, names in _PANELS.items() if name in names), "Run, validation and checkpoints")


def _option(name: str) -> inspect.Parameter:
    field = TrainConfig.model_fields[name]
    typ = _cli_type(field.annotation)
    flag = "--" + name.replace("_", "-")
    decl = flag
    aliases = _ALIASES.get(name, ())
    help_text = (field.description or "").replace("\n", " ")
    if typ is bool:
        help_text = f"{help_text} (--no-{name.replace('_', '-')}: off)"
    default = field.get_default(call_default_factory=True)
    if default not in (None, {}, []):  # "(default: None)" says nothing: such options are simply off unless given
        help_text = f"{help_text} [default: {default}]"
    choices = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is Literal else ()
    opt = typer.Option(None, decl, *aliases, help=escape(help_text.strip()), show_default=False,  # rich markup
                       rich_help_panel=_panel(name), metavar="|".join(choices) or None)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=typ | None)


def _negation(name: str) -> inspect.Parameter:
    """`--no-X` for a bool option X, as an option of its own that `--help` does not list: in the help table a
    `--no-X` twin takes a column of its own and cut long option names at 80 columns (X's help names it)."""
    flag = "--no-" + name.replace("_", "-")
    return inspect.Parameter(f"no_{name}", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                             default=typer.Option(False, flag, hidden=True))


def _run(benchmark: str | None, config_file: Path | None, resume: Path | None, progress: bool,
         overrides: dict[str, Any]) -> None:
    from rllm_train.loop import train
    from rllm_train.rundir import RunDir

    console = Console()
    config: TrainConfig | None = None
    given = {k: v for k, v in overrides.items() if v is not None}
    if benchmark is not None:
        given["benchmark"] = benchmark
    try:
        if resume is not None:
            saved = resume / "config.yaml"
            if not saved.is_file():
                raise ConfigError(f"--resume {resume}: no config.yaml there; is it a run directory of `rllm train`?")
            load_run_config(saved)  # refuses a cut-short file before its gaps become defaults
            base = load_config(saved).model_dump()
            if config_file is not None:
                base.update(load_config(config_file).model_dump(exclude_unset=True))
            config = load_config(None, **{**base, **given, "output": str(resume)})
        else:
            config = load_config(config_file, **given)
        console.print(f"[bold]rllm train[/bold] {config.benchmark} · model {config.model} · backend "
                      f"{config.backend} · {_algo_text(config.algo)}/{config.loss} · "
                      f"{config.batch_size}×{config.group_size} per step · {_steps(config.max_steps)} → "
                      f"{escape(config.output)}", soft_wrap=True, highlight=False)
        result = train(config, resume=resume is not None, progress=progress, console=console)
    except RLLMError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        where = config.output if config is not None else "<run dir>"
        console.print(f"[yellow]interrupted[/yellow]: continue from the last checkpoint with "
                      f"`rllm train --resume {where}`", highlight=False)
        raise typer.Exit(130) from None
    evals = [m for m in RunDir(result.run_dir).read_metrics() if m.get("kind") == "eval"]  # resumed runs too
    console.print(f"done: {_steps(result.steps_done)}{_accuracy_summary(evals)}, checkpoint "
                  f"{result.last_checkpoint}, run dir {result.run_dir}", highlight=False, soft_wrap=True)
    run = shlex.quote(str(result.run_dir))
    if evals:  # the settings the run really used: its config.yaml holds the benchmark's recommendations too
        from rllm_train.loop import validation_settings

        used = load_config(RunDir(result.run_dir).config_file)
        greedy = evals[-1].get("val_greedy/episode/count")  # one per task: the tasks the split really had
        tasks = int(greedy) if greedy else round(evals[-1].get("val/episode/count", 0) / max(used.eval_attempts, 1))
        settings = validation_settings(used, tasks or used.eval_examples)
        console.print(f"  held-out figures under the run's validation settings ({settings}); `rllm eval` "
                      "samples under its own (e.g. ≤ 512 tokens). Base vs "
                      f"trained as a user would compare them: rllm eval {used.benchmark} --model "
                      f"{shlex.quote(used.model)}  and  rllm eval {used.benchmark} --model {run}",
                      highlight=False, soft_wrap=True, markup=False)
    console.print(f"  browse it: rllm view {run}   ·   curves: rllm plot {run} -o curves.png", highlight=False,
                  soft_wrap=True, markup=False)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _algo_text(algo: str | dict[str, str]) -> str:
    """'grpo', or for a per-role map 'solver=grpo,judge=reinforce' (not a Python dict repr in the header)."""
    if isinstance(algo, str):
        return algo
    return ",".join(f"{role}={est}" for role, est in algo.items())


def _accuracy_summary(evals: list[dict[str, Any]]) -> str:
    """', held-out accuracy 0.125 → 0.966 (greedy 0.682 → 1.000)' from the run's first and last validation."""
    if not evals:
        return ""
    first, last = evals[0], evals[-1]

    def span(key: str) -> str:
        a, b = first.get(key), last.get(key)
        if b is None:
            return "n/a"
        return f"{b:.3f}" if len(evals) == 1 or a is None else f"{a:.3f} → {b:.3f}"

    text = f", held-out accuracy {span('val/reward/accuracy')}"
    if "val_greedy/reward/accuracy" in last:
        text += f" (greedy {span('val_greedy/reward/accuracy')})"
    return text


def _make_command() -> Any:
    fixed = [
        inspect.Parameter("benchmark", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str | None,
                          default=typer.Argument(None, help="Benchmark to train on (see `rllm bench list`).")),
        inspect.Parameter("config_file", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--config", help="YAML or TOML file with the same option names.")),
        inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                          default=typer.Option(None, "--resume", help="Continue this run directory from its latest "
                                               "checkpoint (its config.yaml, overridden by the flags given).")),
        inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(True, "--progress/--no-progress", help="Show the progress bar.")),
        inspect.Parameter("logger", inspect.Parameter.KEYWORD_ONLY, annotation=list[str] | None,
                          default=typer.Option(None, "--logger", metavar="NAME", rich_help_panel=_panel("loggers"),
                                               help=escape("Also log metrics to NAME (repeatable): tensorboard "
                                                           "(<run>/tensorboard/, rllm[tensorboard]), wandb (offline "
                                                           "unless WANDB_MODE=online, rllm[wandb]), or a plugin's "
                                                           "(`rllm plugins`). metrics.jsonl is always written."))),
    ]
    options = [_option(n) for n, f in TrainConfig.model_fields.items()  # most maps: config files; lists: above
               if n not in ("benchmark", "loggers")
               and (typing.get_origin(f.annotation) is not dict or n in _MAP_FLAGS)]

    negations = [_negation(p.name) for p in options if p.annotation == (bool | None)]

    def train_command(**kwargs: Any) -> None:
        """Train a model with RL on a benchmark (GRPO on the embedded SmolLM2-135M by default)."""
        for neg in negations:
            name = neg.name.removeprefix("no_")
            if kwargs.pop(neg.name):
                if kwargs.get(name):
                    raise typer.BadParameter(f"--{name.replace('_', '-')} and {neg.default.param_decls[0]} "
                                             "contradict: pass one")
                kwargs[name] = False
        loggers = kwargs.pop("logger")
        kwargs["loggers"] = list(loggers) if loggers else None  # None: the config file's (or none)
        _run(kwargs.pop("benchmark"), kwargs.pop("config_file"), kwargs.pop("resume"), kwargs.pop("progress"),
             kwargs)

    train_command.__signature__ = inspect.Signature(fixed + options + negations)  # type: ignore[attr-defined]
    return train_command


train_command = _make_command()


@hookimpl
def rllm_register_commands(app: typer.Typer) -> None:
    app.command("train")(train_command)
