"""The run directory: everything a run writes, laid out so a monitor (`rllm view`) can read it while it runs.

    <output>/
      config.yaml              the full TrainConfig of the run (resume reads it back)
      metrics.jsonl            one JSON object per line: {"kind": "train"|"eval"|"error", "step": N, "time": t, ...}
      episodes/step_N.jsonl    the episodes of train step N (eval: eval_step_N.jsonl, eval_greedy_step_N.jsonl)
      checkpoints/step_N/      backend state + state.json (written last; see checkpoints.py)
      checkpoints/latest       the name of the newest complete checkpoint
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rllm_core.io import write_jsonl
from rllm_core.types import Episode

__all__ = ["RunDir"]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a monitor reads null as "missing"
    return value


class RunDir:
    """Paths and writers of one run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config_file = self.path / "config.yaml"
        self.metrics_file = self.path / "metrics.jsonl"
        self.episodes_dir = self.path / "episodes"
        self.checkpoints_dir = self.path / "checkpoints"

    def holds_run(self) -> bool:
        """True when a run already wrote here (metrics or checkpoints): a fresh run must not mix into it."""
        return self.metrics_file.exists() or any(self.checkpoints_dir.glob("step_*"))

    def create(self) -> RunDir:
        for d in (self.path, self.episodes_dir, self.checkpoints_dir):
            d.mkdir(parents=True, exist_ok=True)
        return self

    def log(self, kind: str, step: int, metrics: dict[str, Any]) -> None:
        record = {"kind": kind, "step": step, "time": time.time(), **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.metrics_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_file.exists():
            return []
        lines = self.metrics_file.read_text(encoding="utf-8").splitlines()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash mid-write
        return out

    def truncate_metrics_after(self, step: int) -> None:
        """On resume: forget metrics of steps after the checkpoint (they will be redone)."""
        kept = [m for m in self.read_metrics() if m.get("step", 0) <= step]
        tmp = self.metrics_file.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(m) + "\n" for m in kept), encoding="utf-8")
        tmp.replace(self.metrics_file)

    def save_episodes(self, name: str, episodes: Iterable[Episode]) -> Path:
        path = self.episodes_dir / f"{name}.jsonl"
        write_jsonl(path, episodes)
        return path
