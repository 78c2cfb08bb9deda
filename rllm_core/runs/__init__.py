"""The one run directory of `rllm train` and `rllm eval`: its layout, the writers, and a reader that a monitor
(`rllm view`, `rllm plot`) uses while the run is still writing. Torch-free and pydantic-free on the reading side,
so a monitor starts in a fraction of a second and never loads the training stack.

    <run>/
      run.json                 {"format": 1, "kind": "train"|"eval", "started", "pid", "host", "argv"}
      config.yaml              the TrainConfig (train) or the EvalOptions (eval) of the run
      metrics.jsonl            one JSON object per line: {"kind": "train"|"eval"|"error", "step", "time", ...}
      heartbeat.json           {"time", "status": "running", "step", "max_steps", "pid"}, rewritten atomically
                               every ~5 s while the run lives; at the end status "finished", or "failed"
                               with "error"
      log.txt                  the rllm loggers' records and the printed step / eval lines, appended
      episodes/<name>.jsonl    train: step_N, eval_step_N, eval_greedy_step_N; one Episode per line
      episodes/<name>.jsonl.idx  the index sidecar: one small line per episode (byte offset and length in the
                               episodes file, task_id, reward, reason, ... and a ≤200-char preview)
      checkpoints/step_N/      train only (see rllm_train/checkpoints.py)
      episodes.jsonl           eval only: the episodes, appended as they finish (its sidecar episodes.jsonl.idx
                               beside it); the reader calls this file "eval"
      summary.json             eval only, written at the end

Status (`RunReader.info().status`): heartbeat.json says "finished" or "failed" when the run ended on its own;
"running" while its time is under `STALE_AFTER_S` old (and, on the same host, its pid is alive); "crashed"
otherwise (the writer died without a word: SIGKILL, OOM killer, power). Runs written before the heartbeat
existed: "failed" with an `error` record in metrics.jsonl, "running" when a file changed in the last
`STALE_AFTER_S`, else "finished" when they hold metrics (train) or summary.json (eval), else "crashed".
See docs/run-directory.md.
"""

from __future__ import annotations

from rllm_core.runs.episodes import EpisodeWriter, episode_summary, index_path, write_episodes
from rllm_core.runs.layout import FORMAT, STALE_AFTER_S, file_kind
from rllm_core.runs.reader import NotARunError, RunInfo, RunReader, RunReadError, find_runs, open_run
from rllm_core.runs.writer import Heartbeat, RunWriter

__all__ = [
    "FORMAT",
    "STALE_AFTER_S",
    "EpisodeWriter",
    "Heartbeat",
    "NotARunError",
    "RunInfo",
    "RunReadError",
    "RunReader",
    "RunWriter",
    "episode_summary",
    "file_kind",
    "find_runs",
    "index_path",
    "open_run",
    "write_episodes",
]
