"""Does `--max-staleness K` overlap rollouts with the update? Steps per hour at K = 0, 1, 2 against the ideal.

The real training loop and rollout engine, with a backend whose update sleeps T_u (`RecordingBackend`) and an
upstream whose every call takes T_r (the fake upstream; one call per episode, all of a step's episodes at once):
synchronous, a step takes ~T_r + T_u; pipelined, ~max(T_u, T_r). Per-step wall time is the median of the steps
after the first (which has nothing to overlap with), repeats interleaved across K, and the median of repeats is
printed beside the ideal.

    python benchmarks/async_overlap.py [--update-s 1.0] [--rollout-s 1.0] [--steps 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

from rllm_core.cpu_features import matmul_flags
from rllm_testing.fake_upstream import start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder, yesno_config
from rllm_train.backend import BackendCapabilities
from rllm_train.loop import train


def step_seconds(k: int, update_s: float, rollout_s: float, steps: int) -> float:
    with start_fake_upstream(alternating_responder(), delay_s=rollout_s) as up, \
            tempfile.TemporaryDirectory() as tmp:
        backend = RecordingBackend(up.base_url, step_delay_s=update_s, upstream=up,
                                   caps=BackendCapabilities(async_rollouts=True))
        marks: list[float] = []
        original = backend.sync_weights

        def sync() -> int:
            marks.append(time.perf_counter())
            return original()

        backend.sync_weights = sync  # type: ignore[method-assign]
        train(yesno_config(Path(tmp), max_staleness=k, eval_examples=0, max_steps=steps, save_every=steps),
              backend=backend, benchmark=YesNoBenchmark(), progress=False, console=Console(quiet=True))
    return statistics.median(b - a for a, b in itertools.pairwise(marks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update-s", type=float, default=1.0)
    ap.add_argument("--rollout-s", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ks = (0, 1, 2)
    runs: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.repeats):
        for k in ks:
            runs[k].append(step_seconds(k, args.update_s, args.rollout_s, args.steps))
    ideal = max(args.update_s, args.rollout_s)
    print(f"cpu flags: {matmul_flags()} · T_u {args.update_s:g} s, T_r {args.rollout_s:g} s, {args.steps} steps, "
          f"{args.repeats} repeats (median) · ideal step max(T_u, T_r) = {ideal:g} s")
    print(f"{'K':>3}{'s/step':>10}{'steps/hour':>12}{'of ideal':>10}")
    for k in ks:
        sec = statistics.median(runs[k])
        print(f"{k:>3}{sec:>10.3f}{3600 / sec:>12.0f}{ideal / sec:>10.0%}")


if __name__ == "__main__":
    main()
