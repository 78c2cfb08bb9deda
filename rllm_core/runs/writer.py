"""Writing a run directory: run.json, the heartbeat, log.txt and metrics.jsonl, for train and eval alike.

    run = RunWriter(path, "train")
    run.start()                       # run.json, heartbeat thread, log.txt handler on the "rllm" loggers
    run.log("train", 3, metrics)      # one metrics.jsonl line (also the heartbeat's step)
    run.echo("step 3 reward 0.5 ...") # a printed line, into log.txt too
    run.stop(None)                    # heartbeat "finished"; run.stop("why") → "failed"

The heartbeat is what tells a monitor "running" from "crashed": a daemon thread rewrites heartbeat.json every
`HEARTBEAT_S`; a SIGKILLed run stops beating and its heartbeat goes stale. Everything here is best effort:
a full disk or a removed directory must never stop a training run, so write errors are logged once, not raised.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rllm_core.runs.layout import CONFIG, FORMAT, HEARTBEAT, HEARTBEAT_S, LOG, METRICS, RUN_JSON, write_json_atomic

__all__ = ["Heartbeat", "RunWriter"]

log = logging.getLogger("rllm.runs")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a monitor reads null as "missing"
    return value


class Heartbeat:
    """heartbeat.json, rewritten atomically every `interval` seconds by a daemon thread until `stop`."""

    def __init__(self, path: Path, interval: float = HEARTBEAT_S) -> None:
        self.path = path
        self.interval = interval
        self.step: int | None = None
        self.max_steps: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def _write(self, status: str, error: str | None = None) -> None:
        data: dict[str, Any] = {"time": time.time(), "status": status, "step": self.step,
                                "max_steps": self.max_steps, "pid": os.getpid()}
        if error is not None:
            data["error"] = error
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("could not write %s (%s); a monitor may show this run as crashed", self.path, exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._write("running")

    def start(self) -> Heartbeat:
        self._write("running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rllm-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self, error: str | None = None) -> None:
        """The last beat: "finished", or "failed" with `error`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)
            self._thread = None
        self._write("finished" if error is None else "failed", error)


class _LogFile(logging.FileHandler):
    """log.txt: the records of the "rllm" loggers (at their configured level) and the printed lines."""

    def echo(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.acquire()
        try:
            if self.stream is None:
                self.stream = self._open()
            for line in text.splitlines() or [""]:
                self.stream.write(f"{stamp} {line}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a log file that went away must not stop the run
        finally:
            self.release()


class RunWriter:
    """The files every run writes, train or eval; see the module docstring. Paths are attributes."""

    def __init__(self, path: str | Path, kind: str) -> None:
        if kind not in ("train", "eval"):
            raise ValueError(f"kind must be 'train' or 'eval', not {kind!r}")
        self.path = Path(path)
        self.kind = kind
        self.run_file = self.path / RUN_JSON
        self.config_file = self.path / CONFIG
        self.metrics_file = self.path / METRICS
        self.heartbeat_file = self.path / HEARTBEAT
        self.log_file = self.path / LOG
        self.heartbeat: Heartbeat | None = None
        self._log: _LogFile | None = None

    def start(self, argv: list[str] | None = None, max_steps: int | None = None) -> RunWriter:
        """run.json (a resumed run keeps its first `started` and lists when it resumed), the heartbeat, log.txt."""
        self.path.mkdir(parents=True, exist_ok=True)
        now = time.time()
        info: dict[str, Any] = {"format": FORMAT, "kind": self.kind, "started": now, "pid": os.getpid(),
                                "host": socket.gethostname(), "argv": list(sys.argv if argv is None else argv)}
        try:
            old = json.loads(self.run_file.read_text(encoding="utf-8"))
            info["started"] = old.get("started", now)
            info["resumed"] = [*old.get("resumed", []), now]
        except (OSError, ValueError, AttributeError):
            pass
        write_json_atomic(self.run_file, info)
        self.heartbeat = Heartbeat(self.heartbeat_file)
        self.heartbeat.max_steps = max_steps
        self.heartbeat.start()
        self._log = _LogFile(self.log_file, mode="a", encoding="utf-8")
        self._log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                                 "%Y-%m-%d %H:%M:%S"))
        logging.getLogger("rllm").addHandler(self._log)
        return self

    def set_step(self, step: int, max_steps: int | None = None) -> None:
        if self.heartbeat is not None:
            self.heartbeat.step = step
            if max_steps is not None:
                self.heartbeat.max_steps = max_steps

    def log(self, kind: str, step: int, metrics: dict[str, Any]) -> None:
        """One metrics.jsonl record; a train record also moves the heartbeat's step."""
        record = {"kind": kind, "step": step, "time": time.time(), **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.metrics_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if kind == "train":
            self.set_step(step)

    def echo(self, text: str) -> None:
        """A line the user saw on the terminal, into log.txt (markup already stripped)."""
        if self._log is not None:
            self._log.echo(text)

    def stop(self, error: str | None = None) -> None:
        """The end: heartbeat "finished" (error None) or "failed" with the error; log.txt closed. Idempotent."""
        if self.heartbeat is not None:
            self.heartbeat.stop(error)
            self.heartbeat = None
        if self._log is not None:
            logging.getLogger("rllm").removeHandler(self._log)
            self._log.close()
            self._log = None
