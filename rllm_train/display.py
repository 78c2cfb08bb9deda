"""The progress display of `rllm train`: a bar with the current phase, and one line per finished step and
per validation that stays on screen (the bar alone would overwrite a step's figures with the next phase).
The lines are printed with or without the bar, so a log of a `--no-progress` run still shows the curve; pass
a `Console(quiet=True)` for silence."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

__all__ = ["TrainDisplay", "eval_line", "step_line"]


def step_line(step: int, m: dict[str, Any]) -> str:
    """One finished train step, as a user reads it: reward, accuracy, what the update did, where time went."""
    if "skipped" in m:
        return f"step {step:>4}  [yellow]skipped[/yellow]: {m['skipped']}"
    if "sft/epoch" in m:  # rllm sft: no rollouts, the loss is the assistant tokens' negative log-likelihood
        return (f"step {step:>4}  epoch {m['sft/epoch']:.0f}  nll {m.get('train/pg_loss', 0):.4f}  "
                f"gnorm {m.get('train/grad_norm', 0):.2f}  tokens {m.get('train/trained_tokens', 0):.0f}  "
                f"{m.get('time/train_step_s', 0):.1f}s")
    phases = " ".join(f"{p} {m[f'time/{p}_s']:.1f}" for p in ("rollout", "train") if f"time/{p}_s" in m)
    # entropy and grad norm only where the backend measures them (Tinker's service reports neither): a 0.00
    # for a figure nobody computed reads as a dead update
    measured = (("ent", "train/entropy"), ("gnorm", "train/grad_norm"))
    update = "".join(f"{label} {m[key]:.2f}  " for label, key in measured if key in m)
    return (f"step {step:>4}  reward {m.get('reward/mean', 0):.3f}  acc {m.get('reward/accuracy', 0):.2f}  "
            f"len {m.get('episode/response_tokens_mean', 0):.0f}  kl {m.get('train/approx_kl', 0):+.4f}  "
            f"clip {m.get('train/clip_frac', 0):.3f}  {update}{m.get('time/step_s', 0):.1f}s ({phases})")


def eval_line(step: int, m: dict[str, Any]) -> str:
    """One validation on the held-out split: sampled (and greedy) accuracy and reward."""
    text = (f"[bold]eval[/bold] {step:>4}  sampled acc {m.get('val/reward/accuracy', 0):.3f}  "
            f"reward {m.get('val/reward/mean', 0):.3f}")
    if "val_greedy/reward/accuracy" in m:
        text += f"  greedy acc {m['val_greedy/reward/accuracy']:.3f}"
    return text + f"  ({m.get('val/episode/count', 0):.0f} episodes, {m.get('time/eval_s', 0):.1f}s)"


class TrainDisplay:
    """`with TrainDisplay(...) as d: d.phase("step 3: rollouts"); d.step_done(3, metrics)`."""

    def __init__(self, console: Console, total: int, completed: int, bar: bool = True,
                 echo: Callable[[str], None] | None = None) -> None:
        columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[status]}"))
        self.console = console
        self.progress = Progress(*columns, console=console, disable=not bar, transient=False)
        self.task = self.progress.add_task("train", total=total, completed=completed, status="")
        self.echo = echo
        """Also gets each printed line as plain text (the run directory's log.txt)."""

    def _print(self, line: str) -> None:
        self.console.print(line, highlight=False, soft_wrap=True)
        if self.echo is not None:
            self.echo(Text.from_markup(line).plain)

    def __enter__(self) -> TrainDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        if kind is None:  # the bar stays on screen: a finished run must not read "validating on 8 tasks"
            self.progress.update(self.task, status="")
        self.progress.__exit__(kind, exc, tb)

    def phase(self, text: str) -> None:
        self.progress.update(self.task, status=text)

    def step_done(self, step: int, metrics: dict[str, Any]) -> None:
        self.progress.update(self.task, completed=step, status="")
        self._print(step_line(step, metrics))

    def eval_done(self, step: int, metrics: dict[str, Any]) -> None:
        self._print(eval_line(step, metrics))
