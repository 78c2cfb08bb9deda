"""`rllm plot RUN -o curves.png`: a run's main curves in one image, for a report, a PR or a machine without a
browser (`rllm view` is the live, interactive version of the same data).

It reads metrics.jsonl through `rllm_core.runs.reader.RunReader`, so a run that is still writing (a partial
last line) plots what it has so far. Each panel draws one line per metric and record kind: training records
as lines, validation records ("eval") as lines with markers, since they are few and far between. Panels with
no data in this run (no KL without --kl-coef, no entropy on a backend that does not report it) are left out.
matplotlib draws off-screen (the Agg canvas, without pyplot's global state), so it works on any server.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import ConfigError, RLLMError
from rllm_core.runs.reader import RunReader, RunReadError

__all__ = ["PANELS", "PlotResult", "plot_command", "plot_run", "register_plot"]

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean", "val/reward/mean", "val_greedy/reward/mean")),
    ("accuracy", ("reward/accuracy", "val/reward/accuracy", "val_greedy/reward/accuracy")),
    ("response tokens (mean)", ("episode/response_tokens_mean", "val/episode/response_tokens_mean")),
    ("KL: update vs sampler (approx_kl), vs start (kl)", ("train/approx_kl", "train/kl")),
    ("clip fraction", ("train/clip_frac", "train/clip_frac_lower")),
    ("entropy", ("train/entropy",)),
    ("grad norm", ("train/grad_norm",)),
    ("tokens / s", ("throughput/tokens_per_s", "train/tokens_per_s")),
    ("step time (s)", ("time/step_s", "time/rollout_s", "time/train_s")),
)
"""The default grid: (panel title, metric keys drawn in it), in reading order."""

_COLUMNS = 3


@dataclass
class PlotResult:
    """What `plot_run` drew: the image, the panel titles, how many records it read (and skipped as cut)."""

    path: Path
    panels: list[str] = field(default_factory=list)
    records: int = 0
    partial_lines: int = 0


Series = dict[tuple[str, str], list[tuple[int, float]]]
"""(metric key, record kind) → [(step, value)], steps ascending, the last record of a step winning."""


def collect_series(records: Sequence[Mapping[str, Any]]) -> Series:
    """Every finite number of every record, by key and kind (a resumed run's redone steps replace the old)."""
    points: dict[tuple[str, str], dict[int, float]] = {}
    for record in records:
        kind, step = record.get("kind"), record.get("step")
        if not isinstance(kind, str) or not isinstance(step, int) or kind == "error":
            continue
        for key, value in record.items():
            if key in ("kind", "step", "time") or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                points.setdefault((key, kind), {})[step] = float(value)
    return {k: sorted(v.items()) for k, v in points.items()}


def plot_run(run: str | Path, output: str | Path, metrics: Sequence[str] | None = None) -> PlotResult:
    """Draw the curves of the run directory `run` into `output` (its suffix picks the format: .png, .svg,
    .pdf, ...). `metrics`: keys to draw, one panel each, instead of the default grid (`PANELS`)."""
    reader = RunReader(run).require()
    records, _, partial = reader.metrics()
    series = collect_series(records)
    if not series:
        raise RunReadError(f"{reader.path} has no metrics to plot yet ({reader.path / 'metrics.jsonl'} holds no "
                           "complete record): a training run writes one per step, so try again after its first "
                           "step")
    panels = _panels(series, metrics)
    figure_cls, canvas_cls = _matplotlib()
    out = Path(output)
    formats = canvas_cls(figure_cls()).get_supported_filetypes()
    fmt = out.suffix.lstrip(".").lower()
    if fmt not in formats:
        raise ConfigError(f"-o {out}: cannot write a {out.suffix or 'suffix-less'} file; end the name with one of "
                          f"{', '.join('.' + f for f in sorted(formats))} (e.g. curves.png)")
    cols = min(_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = figure_cls(figsize=(5.0 * cols, 3.3 * rows), layout="constrained")
    canvas_cls(fig)
    fig.suptitle(_title(reader), fontsize=12)
    for i, (title, keys) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        _draw(ax, title, keys, series)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return PlotResult(path=out, panels=[t for t, _ in panels], records=len(records), partial_lines=partial)


def _panels(series: Series, metrics: Sequence[str] | None) -> list[tuple[str, tuple[str, ...]]]:
    present = {key for key, _ in series}
    if metrics:
        wanted = list(dict.fromkeys(m.strip() for m in metrics if m.strip()))
        for key in wanted:
            if key not in present:
                close = difflib.get_close_matches(key, sorted(present), n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ConfigError(f"--metrics {key!r}: this run has no such metric{hint}; it has "
                                  f"{_some(sorted(present))}")
        return [(key, (key,)) for key in wanted]
    panels = [(title, tuple(k for k in keys if k in present)) for title, keys in PANELS]
    panels = [(title, keys) for title, keys in panels if keys]
    if not panels:
        raise ConfigError(f"none of the usual training curves is in this run; pick some with --metrics (it has "
                          f"{_some(sorted(present))})")
    return panels


def _draw(ax: Any, title: str, keys: Sequence[str], series: Series) -> None:
    from matplotlib.ticker import MaxNLocator

    lines = [(key, kind) for key in keys for kind in ("train", "eval") if (key, kind) in series]
    lines += [(key, kind) for key in keys for (k, kind) in series if k == key and kind not in ("train", "eval")]
    kinds = {kind for _, kind in lines}
    for key, kind in lines:
        steps, values = zip(*series[(key, kind)], strict=True)
        label = key if len(kinds) == 1 else f"{key} ({kind})"
        style: dict[str, Any] = {"marker": "o", "markersize": 4} if kind != "train" or len(steps) == 1 else {}
        ax.plot(steps, values, label=label, linewidth=1.4, **style)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if len(lines) > 1 or title != keys[0]:
        ax.legend(fontsize=7, loc="best")


def _title(reader: RunReader) -> str:
    config = reader.config()["config"]
    parts = [reader.path.name or str(reader.path)]
    parts += [str(config[k]) for k in ("benchmark", "model", "backend") if config.get(k)]
    return " · ".join(parts)


def _some(keys: list[str], n: int = 12) -> str:
    return ", ".join(keys[:n]) + (f", ... ({len(keys)} in all)" if len(keys) > n else "") if keys else "none"


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError('rllm plot needs matplotlib: pip install "rllm[ui]"') from None
    return Figure, FigureCanvasAgg


def plot_command(
    run: Path = typer.Argument(..., help="A run directory (the --output of `rllm train`)."),
    output: Path = typer.Option(Path("curves.png"), "-o", "--output",
                                help="Image to write; the suffix picks the format (.png, .svg, .pdf)."),
    metrics: str | None = typer.Option(None, "--metrics", help="Comma-separated metric keys to draw, one panel "
                                       "each (e.g. reward/mean,val/reward/accuracy); default: the main curves."),
) -> None:
    """Draw a run's training curves (reward, accuracy, length, KL, clipping, entropy, grad norm, speed) to a file."""
    console = Console()
    try:
        result = plot_run(run, output, metrics.split(",") if metrics else None)
    except RLLMError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    cut = f", {result.partial_lines} unreadable line(s) skipped" if result.partial_lines else ""
    console.print(f"wrote {escape(str(result.path))}: {len(result.panels)} panels from {result.records} "
                  f"records{cut}", soft_wrap=True, highlight=False)


def register_plot(app: typer.Typer) -> None:
    """Add `rllm plot` to the CLI (called by rllm_monitor.plugin's rllm_register_commands)."""
    app.command("plot")(plot_command)
