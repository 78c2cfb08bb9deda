"""A W&B run per training run, written under `<run>/wandb/`.

Offline by default: a training run must never wait on a network it may not have (wandb.init online blocks
for its `init_timeout` when the service is unreachable). It goes online only when the user asks for it
twice over: WANDB_MODE=online *and* WANDB_API_KEY set; WANDB_MODE=disabled turns it off. An offline run is
uploaded later with `wandb sync <run>/wandb/offline-run-*`.

Series are tagged like TensorBoard's (`train/reward/mean`, `eval/val/reward/accuracy`) and plotted against a
`step` metric of their own (`define_metric`), not wandb's internal step: a validation logged at the same step
as the train record before it, or a resumed run's first step, is then never dropped as "out of order".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import wandb

from rllm_core.loggers import metric_tag

__all__ = ["WandbLogger", "wandb_mode"]

log = logging.getLogger("rllm.loggers")


def wandb_mode(env: Mapping[str, str] | None = None) -> str:
    """"online" only for WANDB_MODE=online with WANDB_API_KEY set, "disabled" for WANDB_MODE=disabled,
    else "offline" (a warning says why when online was asked for without a key)."""
    env = os.environ if env is None else env
    asked = env.get("WANDB_MODE", "").strip().lower()
    if asked == "disabled":
        return "disabled"
    if asked == "online":
        if env.get("WANDB_API_KEY"):
            return "online"
        log.warning("WANDB_MODE=online but WANDB_API_KEY is not set: logging to W&B offline instead "
                    "(upload later with `wandb sync`)")
    return "offline"


class WandbLogger:
    """One wandb run: project $WANDB_PROJECT (default "rllm"), named after the run directory."""

    def __init__(self, run_dir: Path, mode: str | None = None) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.mode = mode or wandb_mode()
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, init_timeout=60)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "rllm", name=run_dir.name,
                              dir=str(run_dir), mode=self.mode, job_type="train", settings=settings,  # type: ignore[arg-type]
                              reinit="create_new")
        self.run.define_metric("step")
        self._kinds: set[str] = set()

    @property
    def run_dir(self) -> Path:
        """This wandb run's own directory (`<run>/wandb/offline-run-*/` offline)."""
        return Path(self.run.dir).parent

    def log_metrics(self, kind: str, step: int, metrics: Mapping[str, float]) -> None:
        if kind not in self._kinds:
            self.run.define_metric(f"{kind}/*", step_metric="step")
            self._kinds.add(kind)
        self.run.log({"step": step, **{metric_tag(kind, k): v for k, v in metrics.items()}})

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        """Finish the run and stop wandb's service process: `finish()` alone can return before the service has
        flushed the run file (seen with wandb 0.31 offline), and a run's end is where its data must be whole."""
        self.run.finish()
        wandb.teardown()
