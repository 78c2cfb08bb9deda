"""The run directory of `rllm train`: everything a run writes, laid out so a monitor (`rllm view`) can read it while
it runs. The layout is the one of `rllm_core.runs` (shared with `rllm eval`; docs/run-directory.md):

    <output>/
      run.json                 {"format": 1, "kind": "train", "started", "pid", "host", "argv"}
      config.yaml              the full TrainConfig of the run (resume reads it back)
      metrics.jsonl            one JSON object per line: {"kind": "train"|"eval"|"error", "step": N, "time": t, ...}
      heartbeat.json           rewritten every ~5 s while the run lives; "finished" / "failed" at the end
      log.txt                  the rllm loggers' records and the printed step / eval lines
      episodes/step_N.jsonl    the episodes of train step N (eval: eval_step_N.jsonl, eval_greedy_step_N.jsonl),
                               each with its index sidecar step_N.jsonl.idx
      checkpoints/step_N/      backend state + state.json (written last; see checkpoints.py)
      checkpoints/latest       the name of the newest complete checkpoint
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rllm_core.runs.episodes import write_episodes
from rllm_core.runs.writer import RunWriter
from rllm_core.types import Episode

__all__ = ["RunDir"]


class RunDir(RunWriter):
    """Paths and writers of one training run directory (`start` / `stop` / `log` / `echo`: see RunWriter)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "train")
        self.episodes_dir = self.path / "episodes"
        self.checkpoints_dir = self.path / "checkpoints"
        self.loggers: Any = None
        """A `rllm_core.loggers.LoggerGroup` (`--logger`): every record also goes to it, after metrics.jsonl."""

    def log(self, kind: str, step: int, metrics: dict[str, Any]) -> None:
        super().log(kind, step, metrics)
        if self.loggers is not None:
            self.loggers.log(kind, step, metrics)

    def log_teacher(self, step: int, record: dict[str, Any]) -> None:
        """teacher.jsonl: the distillation teacher's calls of each step, apart from the trained Steps."""
        with open(self.path / "teacher.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **record}) + "\n")

    def holds_run(self) -> bool:
        """True when a run already wrote here (metrics or checkpoints): a fresh run must not mix into it."""
        return self.metrics_file.exists() or any(self.checkpoints_dir.glob("step_*"))

    def create(self) -> RunDir:
        for d in (self.path, self.episodes_dir, self.checkpoints_dir):
            d.mkdir(parents=True, exist_ok=True)
        return self

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
        """episodes/<name>.jsonl and its index sidecar <name>.jsonl.idx."""
        path = self.episodes_dir / f"{name}.jsonl"
        write_episodes(path, episodes)
        return path
