"""How fast the run reader is on a big episodes file: 10,000 synthetic episodes of ~3 KB in one file.

    python benchmarks/run_reader_10k.py [--episodes 10000]

Prints the median of 5 of: listing the files (cold: a new reader parses the sidecar; warm: a poll of a reader
that has), paging 50 summaries, per-file reason counts, loading one episode (cold and warm), the sidecar-less
fallback scan, and an incremental metrics poll.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from rllm_core.runs import RunReader, RunWriter, index_path, write_episodes
from rllm_core.types import Episode, Step, Task, Trajectory

REASONS = ["correct", "wrong_answer", "no_answer_extracted", "format_error", "truncated"]


def _episode(i: int) -> Episode:
    text = f"Let me think about problem {i}. " + "reasoning " * 230 + f"\\boxed{{{i % 7}}}"
    ids = list(range(100, 160))
    step = Step(messages=[{"role": "user", "content": f"What is {i} mod 7?"}], text=text,
                prompt_token_ids=list(range(20)), completion_token_ids=ids, logprobs=[-0.5] * len(ids),
                token_source="server")
    reason = REASONS[i % len(REASONS)]
    return Episode(task=Task(id=f"t{i // 8}", instruction=f"What is {i} mod 7?"), attempt=i % 8,
                   trajectories=[Trajectory(steps=[step])], reward=1.0 if reason == "correct" else 0.0,
                   reward_reason=reason, is_correct=reason == "correct")


def _median(fn: Callable[[], object], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=10_000)
    n = ap.parse_args().episodes
    with tempfile.TemporaryDirectory() as tmp:
        run = RunWriter(Path(tmp) / "run", "train")
        run.start(argv=["bench"])
        for step in range(1, 201):
            run.log("train", step, {"reward/mean": 0.5, "reward/accuracy": 0.5})
        path = Path(tmp) / "run" / "episodes" / "step_1.jsonl"
        t = time.perf_counter()
        write_episodes(path, (_episode(i) for i in range(n)))
        write_s = time.perf_counter() - t
        run.stop(None)
        size = path.stat().st_size
        print(f"{n} episodes, {size / n / 1024:.1f} KB each, {size / 2**20:.1f} MiB; sidecar "
              f"{index_path(path).stat().st_size / 2**20:.1f} MiB; written in {write_s:.1f} s")
        root = Path(tmp) / "run"
        warm = RunReader(root)
        warm.files()
        rows = [
            ("list files, cold (new reader)", lambda: RunReader(root).files()),
            ("list files, warm (poll)", warm.files),
            ("page 50 summaries (offset 5000), warm", lambda: warm.summaries("step_1")[5000:5050]),
            ("reason counts of the file, warm",
             lambda: Counter(s["reason"] for s in warm.summaries("step_1") if not s["reward"])),
            ("load one episode, cold (new reader)", lambda: RunReader(root).episode("step_1", n // 2)),
            ("load one episode, warm", lambda: warm.episode("step_1", n // 2)),
            ("info(), warm", warm.info),
            ("metrics poll (nothing new), warm", lambda: warm.metrics(since=200)),
            ("metrics, cold (200 records)", lambda: RunReader(root).metrics()),
        ]
        for label, fn in rows:
            print(f"{label:<42} {_median(fn):8.2f} ms")
        index_path(path).unlink()
        print(f"{'summaries without sidecar (full scan), cold':<42} "
              f"{_median(lambda: RunReader(root).summaries('step_1'), n=3):8.2f} ms")


if __name__ == "__main__":
    main()
