"""How fast `rllm view` answers what its page needs to show a run of 10,000 episodes.

Builds a synthetic train run (one episodes file of 10,000 episodes of ~3 KB, with its index sidecar, and
1,000 metrics records), serves it with `start_view_server`, and times over HTTP each request the page makes
to show the run: runs, files, metrics, the first episodes page, the diagnosis, one episode. "cold" is the
first request to a fresh server (the reader builds its caches), the median of 5 fresh servers; "warm" is the
median of 5 repeats on one server (what a page reload or a poll costs).

    .venv/bin/python benchmarks/view_10k.py [--episodes 10000] [--model NAME]

--model sets the run's config model: by default one with no tokenizer (token texts null), which times the
server alone; `--model tiny-random` adds the tokenizer (its first load is seconds, then cached).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from rllm_core.runs import write_episodes
from rllm_monitor.server import start_view_server

REASONS = ("correct", "wrong_answer", "no_answer_extracted", "truncated", "format_error")


def _episode(i: int, rng: random.Random) -> dict:
    reason = rng.choice(REASONS)
    ids = [rng.randrange(49_000) for _ in range(100)]
    step = {"messages": [{"role": "system", "content": "You are a careful solver. " * 8},
                         {"role": "user", "content": f"Problem {i}: " + "compute the sum of the numbers. " * 20}],
            "text": f"Reasoning for {i}: " + "add them one by one. " * 25 + f"Answer: {i % 97}",
            "completion_token_ids": ids, "logprobs": [round(-rng.random() * 3, 4) for _ in ids],
            "prompt_token_ids": ids[:40], "token_source": "server", "finish_reason": "stop"}
    reward = 1.0 if reason == "correct" else 0.0
    return {"id": f"ep{i}", "task": {"id": f"task{i // 8}", "instruction": f"Problem {i}"},
            "trajectories": [{"name": "solver", "steps": [step]}], "reward": reward, "reward_reason": reason,
            "is_correct": reward > 0, "metrics": {}, "attempt": i % 8}


def build_run(run: Path, n: int, model: str) -> None:
    rng = random.Random(0)
    run.mkdir(parents=True)
    now = time.time()
    (run / "run.json").write_text(json.dumps({"format": 1, "kind": "train", "started": now, "pid": 0,
                                              "host": "bench", "argv": ["bench"]}))
    (run / "config.yaml").write_text(f"benchmark: arithmetic\nmodel: {model}\nbackend: local\nmax_steps: 1000\n")
    (run / "heartbeat.json").write_text(json.dumps({"time": now, "status": "finished", "step": 1000}))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "time": now + s, "reward/mean": rng.random(),
                    "train/approx_kl": rng.random() / 100, "episode/response_tokens_mean": 100.0}) + "\n"
        for s in range(1, 1001)))
    write_episodes(run / "episodes" / "step_1000.jsonl", (_episode(i, rng) for i in range(n)))


REQUESTS = [
    ("runs", "/api/runs", {}),
    ("files", "/api/files", {"run": "."}),
    ("metrics", "/api/metrics", {"run": ".", "since": 0}),
    ("episodes page", "/api/episodes", {"run": ".", "file": "step_1000", "offset": 0, "limit": 50}),
    ("diagnosis", "/api/diagnosis", {"run": "."}),
    ("one episode", "/api/episode", {"run": ".", "file": "step_1000", "index": 5000}),
]


def _timed(client: httpx.Client, path: str, params: dict) -> float:
    t = time.perf_counter()
    resp = client.get(path, params=params)
    elapsed = time.perf_counter() - t
    resp.raise_for_status()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--model", default="no-tokenizer-here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t = time.perf_counter()
        build_run(run, args.episodes, args.model)
        size = (run / "episodes" / "step_1000.jsonl").stat().st_size
        print(f"built {args.episodes} episodes ({size / 1e6:.1f} MB, {size / args.episodes / 1e3:.1f} KB each) "
              f"in {time.perf_counter() - t:.1f} s")
        cold: dict[str, list[float]] = {name: [] for name, _, _ in REQUESTS}
        warm: dict[str, list[float]] = {name: [] for name, _, _ in REQUESTS}
        for rep in range(5):
            with start_view_server(run) as server, httpx.Client(base_url=server.url, timeout=120) as client:
                for name, path, params in REQUESTS:
                    cold[name].append(_timed(client, path, params))
                if rep == 4:
                    for _ in range(5):
                        for name, path, params in REQUESTS:
                            warm[name].append(_timed(client, path, params))
        print(f"{'request':<16}{'cold ms':>10}{'warm ms':>10}   (median of 5)")
        rows = [(name, statistics.median(cold[name]), statistics.median(warm[name])) for name, _, _ in REQUESTS]
        rows.append(("page total", sum(r[1] for r in rows), sum(r[2] for r in rows)))
        for name, c, w in rows:
            print(f"{name:<16}{c * 1e3:>10.1f}{w * 1e3:>10.1f}")


if __name__ == "__main__":
    main()
