"""TensorBoard scalars written with tensorboard's own event-file writer (no torch, no TensorFlow needed).

Each metrics record becomes one event of `simple_value` scalars, tagged `train/...` / `eval/...` (see
`rllm_core.loggers.metric_tag`): the classic scalar format every TensorBoard (and torch's SummaryWriter) reads.
`tensorboard.summary.Writer` would need tensor summaries that older readers show only as tensors. The writer is
flushed after every record, so `tensorboard --logdir <run>` shows a step as soon as it is done (a step takes
seconds; a flush is one small write). A resumed run appends a new event file beside the old one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from rllm_core.loggers import metric_tag

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger:
    """Writes `<run_dir>/tensorboard/events.out.tfevents.*`."""

    def __init__(self, run_dir: Path) -> None:
        self.log_dir = Path(run_dir) / "tensorboard"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.log_dir), flush_secs=30)

    def log_metrics(self, kind: str, step: int, metrics: Mapping[str, float]) -> None:
        values = [Summary.Value(tag=metric_tag(kind, key), simple_value=float(value))
                  for key, value in metrics.items()]
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))
        self._writer.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The config as a YAML block in TensorBoard's Text tab (tag `config`)."""
        text = yaml.safe_dump(json.loads(json.dumps(dict(config), default=str)), sort_keys=False)
        block = "\n".join("    " + line for line in text.splitlines())  # markdown code block: keeps the indents
        summary = text_pb("config", block)
        self._writer.add_event(Event(wall_time=time.time(), step=0, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
