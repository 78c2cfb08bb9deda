"""The BM25 index and the retrieval server against corpus size: build time, RSS, queries/s, and latency under load.

    python benchmarks/retrieval_scale.py                                  # 10k, 100k, 1M passages
    python benchmarks/retrieval_scale.py --sizes 10000,100000 --server-size 100000

Corpora are generated (no download): passages of 40-80 words drawn from a Zipf-distributed vocabulary of 50,000
made-up words, titles of 2-4 words; queries are 3-5 words taken from random passages, so every query has matches.
Each size is built in a fresh child process, so its peak RSS is its own (`ru_maxrss` of the child). The server
part starts `rllm retrieve serve` on one size in its own process and drives /search from this one with 1, 8 and 64
concurrent clients (one query per request, httpx), reporting queries/s and p50/p99 latency. Prints the CPU flags first:
figures from one kind of CPU say nothing of another.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_corpus(path: Path, n: int, seed: int = 0) -> list[str]:
    """Write n passages to `path`; return 1,000 queries drawn from them."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(50_000)]
    weights = [1 / (r + 1) for r in range(len(vocab))]
    cum = list(itertools.accumulate(weights))
    queries: list[str] = []
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            words = rng.choices(vocab, cum_weights=cum, k=rng.randint(40, 80))
            title = " ".join(rng.choices(vocab, cum_weights=cum, k=rng.randint(2, 4)))
            f.write(json.dumps({"id": f"d{i}", "title": title, "text": " ".join(words)}) + "\n")
            if len(queries) < 1000 and rng.random() < 1000 / n * 2:
                queries.append(" ".join(rng.sample(words, rng.randint(3, 5))))
    return queries


def child(corpus: str, queries_file: str, cache: str) -> None:
    """Build, then query: print one JSON line of figures."""
    from rllm_envs.search.bm25_index import open_index

    started = time.monotonic()
    index = open_index(corpus, cache_root=Path(cache), rebuild=True)
    built = time.monotonic() - started
    rss_built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.monotonic()
    from rllm_envs.search.bm25_index import BM25Index

    loaded = BM25Index.load(next(Path(cache).iterdir()))
    load_s = time.monotonic() - started
    queries = json.loads(Path(queries_file).read_text())
    started = time.monotonic()
    for q in queries:
        loaded.search(q, 5)
    single = len(queries) / (time.monotonic() - started)
    started = time.monotonic()
    for i in range(0, len(queries), 100):
        loaded.search_batch(queries[i: i + 100], 5)
    batched = len(queries) / (time.monotonic() - started)
    print(json.dumps({"passages": len(index), "build_s": built, "load_s": load_s, "peak_rss_gib": rss_built / 2**30,
                      "qps_one_at_a_time": single, "qps_batches_of_100": batched}))


def _drive(url: str, queries: list[str], clients: int, per_client: int) -> dict[str, float]:
    """`clients` threads, each sending `per_client` one-query /search requests."""
    import httpx

    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def run(k: int) -> None:
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
            for j in range(per_client):
                t = time.monotonic()
                r = http.post("/search", json={"queries": [queries[(k * per_client + j) % len(queries)]], "k": 5})
                with lock:
                    latencies.append(time.monotonic() - t)
                    errors[0] += r.status_code != 200

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    latencies.sort()
    return {"clients": clients, "qps": len(latencies) / wall, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))], "errors": errors[0]}


def server_load(corpus: str, queries: list[str], home: str, clients: tuple[int, ...], per_client: int
                ) -> list[dict[str, float]]:
    """`rllm retrieve serve` in its own process (as users run it), the clients in this one."""
    import httpx

    from rllm_core.net import free_port

    port = free_port("127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "rllm", "retrieve", "serve", "--corpus", corpus, "--port",
                             str(port), "--max-concurrency", str(os.cpu_count() or 2), "--max-queue", "1024"],
                            env={**os.environ, "RLLM_HOME": home}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise RuntimeError("the retrieval server exited before it was up") from None
                time.sleep(0.5)
        return [_drive(url, queries, n, per_client) for n in clients]
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--server-size", type=int, default=100_000)
    parser.add_argument("--per-client", type=int, default=50, help="requests each client sends")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    from rllm_core.cpu_features import cpu_flags

    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))
    print(f"CPU: {os.cpu_count()} cores, flags {' '.join(flags)}")
    out: dict[str, object] = {"cpu_flags": flags, "cores": os.cpu_count(), "sizes": [], "server": []}
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="rllm-retrieval-scale-") as tmp:
        print(f"{'passages':>10} {'gen s':>7} {'build s':>8} {'load s':>7} {'peak RSS':>9} {'q/s 1x1':>8} "
              f"{'q/s x100':>9}")
        server_queries: list[str] = []
        for n in sizes:
            corpus, qfile, cache = Path(tmp) / f"c{n}.jsonl", Path(tmp) / f"q{n}.json", Path(tmp) / f"idx{n}"
            started = time.monotonic()
            queries = make_corpus(corpus, n)
            gen = time.monotonic() - started
            qfile.write_text(json.dumps(queries))
            proc = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(qfile), str(cache)],
                                  capture_output=True, text=True, check=True)
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["generate_s"] = gen
            out["sizes"].append(row)  # type: ignore[union-attr]
            print(f"{n:>10,} {gen:>7.1f} {row['build_s']:>8.1f} {row['load_s']:>7.2f} {row['peak_rss_gib']:>7.2f} G "
                  f"{row['qps_one_at_a_time']:>8.0f} {row['qps_batches_of_100']:>9.0f}", flush=True)
            if n == args.server_size:
                server_queries = queries
            else:
                corpus.unlink()
        if server_queries:
            corpus = Path(tmp) / f"c{args.server_size}.jsonl"
            rows = server_load(str(corpus), server_queries, str(Path(tmp) / "home"), (1, 8, 64), args.per_client)
            out["server"] = rows
            print(f"\nretrieval server, {args.server_size:,} passages, /search one query per request")
            print(f"{'clients':>8} {'q/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
            for r in rows:
                print(f"{r['clients']:>8} {r['qps']:>8.0f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['errors']:>7}")
    if args.output:
        Path(args.output).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
