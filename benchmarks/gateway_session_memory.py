"""Does the gateway's memory stay flat over a long run? Sessions recorded and taken in turn, with the leaks a
real run has: some sessions never taken (an agent that crashed before its rollout took them), late steps for
taken sessions (a timed-out sync agent), and calls that name no session (the default one).

Each session gets `--steps` steps of ~`--tokens` token ids; the store's clock advances `--tick` seconds per
session, so the one-hour TTLs (idle sessions, tombstones) are reached within the run. RSS and the Python heap
(tracemalloc) are printed every `--every` sessions; flat numbers after the first TTL mean nothing grows.
`--gateway N` also sends N sessions' calls through a real gateway over HTTP to the fake upstream.

    python benchmarks/gateway_session_memory.py --sessions 20000
    python benchmarks/gateway_session_memory.py --store sqlite:/tmp/gw-mem.db --sessions 20000
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
import tracemalloc


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--tick", type=float, default=1.0, help="store-clock seconds per session")
    parser.add_argument("--every", type=int, default=2_000)
    parser.add_argument("--store", default="memory", help="memory or sqlite:PATH")
    parser.add_argument("--gateway", type=int, default=0, help="sessions also run through a real gateway")
    args = parser.parse_args()

    from rllm_core.types import Step
    from rllm_rollout.gateway.config import StoreLimits
    from rllm_rollout.gateway.sqlite_store import SqliteStore
    from rllm_rollout.gateway.store import DEFAULT_SESSION, MemoryStore

    now = [0.0]
    limits = StoreLimits()  # the defaults: 1 h TTLs, 10k default-session steps
    if args.store == "memory":
        store = MemoryStore(limits, clock=lambda: now[0])
    else:
        store = SqliteStore(args.store.partition(":")[2] or tempfile.mktemp(suffix=".db"), limits,
                            clock=lambda: now[0])

    def make_step(i: int) -> Step:
        ids = list(range(i % 1000, i % 1000 + args.tokens))
        return Step(messages=[{"role": "user", "content": f"task {i}"}], prompt_token_ids=ids,
                    completion_token_ids=ids, logprobs=[-0.1] * len(ids), text="x" * 40)

    tracemalloc.start()
    print(f"store={args.store} sessions={args.sessions} steps/session={args.steps} tokens/step={args.tokens}")
    print(f"{'sessions':>9} {'rss MiB':>8} {'heap MiB':>9} {'open':>6} {'closed':>7} {'steps':>7} {'late':>6} "
          f"{'expired':>8} {'dflt drop':>9} {'s/1k':>6}")
    t0 = last = time.perf_counter()
    for i in range(1, args.sessions + 1):
        sid = f"ep-{i}"
        for k in range(args.steps):
            store.add(sid, [make_step(i * 10 + k)])
        store.add(DEFAULT_SESSION, [make_step(i)])
        if i % 50 != 0:  # 2% are never taken: they must expire
            store.take(sid, take_id=f"t{i}" if i % 2 else None)
            if i % 10 == 0:  # a late step of a call still in flight at the take
                store.add(sid, [make_step(i)])
            if i % 2:
                store.ack(sid, f"t{i}")
        now[0] += args.tick
        if i % args.every == 0:
            gc.collect()
            heap, _ = tracemalloc.get_traced_memory()
            st = store.stats()
            per_k = (time.perf_counter() - last) / args.every * 1000
            last = time.perf_counter()
            print(f"{i:>9} {rss_mib():>8.1f} {heap / 2**20:>9.1f} {st.open_sessions:>6} {st.closed_sessions:>7} "
                  f"{st.stored_steps:>7} {st.late_steps:>6} {st.expired_sessions:>8} "
                  f"{st.default_dropped_steps:>9} {per_k:>6.2f}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    store.close()
    if args.gateway:
        run_gateway(args.gateway, args.every)


def run_gateway(n: int, every: int) -> None:
    """n sessions of two calls each through a real gateway (HTTP, the fake upstream), each taken in turn."""
    import httpx

    from rllm_rollout.gateway import UpstreamConfig, start_gateway
    from rllm_testing.fake_upstream import start_fake_upstream

    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    with start_fake_upstream() as up, start_gateway([UpstreamConfig(url=up.base_url)]) as gw, \
            httpx.Client(headers={"Authorization": f"Bearer {gw.client_api_key}"}) as http:
        print(f"through the gateway: {n} sessions × 2 calls")
        for i in range(1, n + 1):
            for _ in range(2):
                http.post(f"{gw.session_base_url(f'g{i}')}/chat/completions", json=body).raise_for_status()
            gw.take_steps(f"g{i}")
            up.requests.clear()
            up.authorizations.clear()
            if i % every == 0:
                gc.collect()
                heap, _ = tracemalloc.get_traced_memory()
                st = gw.stats()
                print(f"{i:>9} rss {rss_mib():.1f} MiB heap {heap / 2**20:.1f} MiB open {st['open_sessions']} "
                      f"closed {st['closed_sessions']}")


if __name__ == "__main__":
    main()
