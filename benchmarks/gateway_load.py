"""The gateway under load and faults: nothing lost, duplicated or misattributed, and what it costs.

10,000 calls (chat, streamed chat, completions, Responses API) over 64 concurrent sessions go through
`rllm gateway` to a `FaultyUpstream` that fails 5 % of them (HTTP 500, a TCP reset mid-stream, a stall past
the gateway's `--timeout`), each fate a hash of the seed and the call's marker. Each session makes its calls
one after another, like an agent, then takes its Steps; `faulty_upstream.verify` checks one Step per call, in
its session, errored exactly for the injected failures, and exact ids/logprobs for the rest. Run once per store
(in-memory, SQLite), side by side.

Measured:
- calls/s through the gateway (every call, faults included);
- added latency: the same calls sent straight to the upstream (with the fields the gateway would inject), in
  rounds interleaved with the gateway's; per round p50/p99 of served calls through the gateway minus direct,
  the median over rounds reported (interleaving cancels the drift of a shared machine);
- gateway memory: RSS of the `rllm gateway` subprocess (psutil) at start, peak (sampled every 50 ms), and
  after every session was taken.

    python benchmarks/gateway_load.py                       # 10,000 calls x 2 stores
    python benchmarks/gateway_load.py --calls 2000 --sessions 16 --stores memory
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rllm_core.types import Step
from rllm_rollout.gateway.client import RemoteGateway
from rllm_testing.faulty_upstream import CallOutcome, LoadReport, fault_for, plan_calls, run_session, verify

console = Console(width=None if sys.stdout.isatty() else 130)

UPSTREAM_SCRIPT = """
import sys, threading
from rllm_testing.faulty_upstream import start_faulty_upstream
with start_faulty_upstream(seed=int(sys.argv[1]), fault_rate=float(sys.argv[2]), stall_s=float(sys.argv[3])) as up:
    print(up.url, flush=True)
    threading.Event().wait()
"""


@dataclass
class StoreResult:
    store: str
    report: LoadReport
    wall_s: float
    calls_per_s: float
    added_ms: dict[str, float]
    abs_ms: dict[str, float]
    rss_mib: dict[str, float]
    gateway_stats: dict[str, object]
    upstream_faults: dict[str, int]
    round_added: list[tuple[float, float]] = field(default_factory=list)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


@contextmanager
def process(cmd: list[str], name: str, lines: int) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Start a server subprocess and read the first `lines` lines it prints (its URL, token); always stopped."""
    env = {**os.environ, "RLLM_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile() as log:  # stderr to a file: a pipe nobody reads would block the server
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
        try:
            assert proc.stdout is not None
            out = [proc.stdout.readline().strip() for _ in range(lines)]
            if proc.poll() is not None or not all(out):
                log.seek(0)
                raise SystemExit(f"{name} did not start ({' '.join(cmd)}):\n"
                                 f"{log.read()[-2000:].decode(errors='replace')}")
            yield proc, out
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class RssSampler:
    """Peak RSS of a process, sampled from a thread (the gateway's own memory, nothing of this process)."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self.proc = psutil.Process(pid)
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def now(self) -> int:
        return int(self.proc.memory_info().rss)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self.peak = max(self.peak, self.now())
            except psutil.Error:
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)


def served(outcomes: list[CallOutcome], seed: int, rate: float, stream: bool | None = None) -> list[float]:
    """Latencies of calls the upstream served (faults excluded: a stall's latency is the timeout)."""
    return [o.latency_s for o in outcomes if fault_for(o.spec.marker, seed, rate) is None and o.complete
            and (stream is None or o.spec.stream == stream)]


async def run_store(store: str, upstream_url: str, args: argparse.Namespace, progress: Progress,
                    tmp: Path) -> StoreResult:
    spec = "memory" if store == "memory" else f"sqlite:{tmp / 'gateway.db'}"
    cmd = [sys.executable, "-m", "rllm", "gateway", "--upstream", f"{upstream_url}/v1", "--port", "0",
           "--timeout", str(args.timeout), "--store", spec]
    plan = plan_calls(args.calls, args.sessions, args.seed, prefix=f"{store}-{int(time.time())}")
    rounds = max(1, args.rounds)
    parts = {sid: [specs[r * len(specs) // rounds:(r + 1) * len(specs) // rounds] for r in range(rounds)]
             for sid, specs in plan.items()}
    task = progress.add_task(f"{store}: gateway", total=args.calls)
    dtask = progress.add_task(f"{store}: direct", total=sum(
        max(1, int(len(p) * args.direct_share)) for ps in parts.values() for p in ps if p))
    with process(cmd, "rllm gateway", 2) as (proc, (gw_url, token)):
        remote = RemoteGateway(gw_url, api_key=token)
        rss = RssSampler(proc.pid)
        rss_start = rss.now()
        outcomes: list[CallOutcome] = []
        taken: dict[str, list[Step]] = {}
        round_added: list[tuple[float, float]] = []
        gw_time = 0.0
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=max(30.0, args.stall * 4))
        with rss:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
                for r in range(rounds):
                    direct = await asyncio.gather(*(
                        run_session(http, f"{upstream_url}/v1", None,
                                    ps[r][:max(1, int(len(ps[r]) * args.direct_share))], direct=True,
                                    on_call=lambda: progress.advance(dtask))
                        for ps in parts.values() if ps[r]))
                    last = r == rounds - 1
                    t0 = time.perf_counter()
                    sids = [sid for sid, ps in parts.items() if ps[r]]  # the last part is never empty
                    through = await asyncio.gather(*(
                        run_session(http, remote.session_base_url(sid), token, parts[sid][r],
                                    take=remote.atake_steps if last else None,
                                    on_call=lambda: progress.advance(task))
                        for sid in sids))
                    gw_time += time.perf_counter() - t0
                    d = [o for os_, _ in direct for o in os_]
                    g = [o for os_, _ in through for o in os_]
                    outcomes += g
                    round_added.append((pct(served(g, args.seed, args.fault_rate), 0.5)
                                        - pct(served(d, args.seed, args.fault_rate), 0.5),
                                        pct(served(g, args.seed, args.fault_rate), 0.99)
                                        - pct(served(d, args.seed, args.fault_rate), 0.99)))
                    if last:
                        taken = {sid: steps for sid, (_, steps) in zip(sids, through, strict=True)}
        rss_after = rss.now()
        stats = await asyncio.to_thread(remote.stats)
        remote.close()
    async with aiohttp.ClientSession() as http, http.get(f"{upstream_url}/faults") as resp:
        faults_seen = await resp.json()
    report = verify(outcomes, taken, args.seed, args.fault_rate)
    mib = 1024 * 1024
    return StoreResult(
        store=store, report=report, wall_s=gw_time, calls_per_s=len(outcomes) / gw_time,
        added_ms={"p50": statistics.median(a for a, _ in round_added),
                  "p99": statistics.median(b for _, b in round_added)},
        abs_ms={"p50": pct(served(outcomes, args.seed, args.fault_rate), 0.5),
                "p99": pct(served(outcomes, args.seed, args.fault_rate), 0.99)},
        rss_mib={"start": rss_start / mib, "peak": rss.peak / mib, "after": rss_after / mib},
        gateway_stats=stats, upstream_faults=faults_seen, round_added=round_added)


def show(results: list[StoreResult], args: argparse.Namespace) -> None:
    t = Table(title=f"gateway under load: {args.calls} calls, {args.sessions} sessions, {args.fault_rate:.0%} "
                    f"faults, upstream timeout {args.timeout:g} s")
    t.add_column("")
    for r in results:
        t.add_column(r.store, justify="right")

    def row(name: str, f: object) -> None:
        t.add_row(name, *(str(f(r)) for r in results))  # type: ignore[operator]

    row("calls/s (gateway phases)", lambda r: f"{r.calls_per_s:.0f}")
    row("latency p50 / p99 ms (served)", lambda r: f"{r.abs_ms['p50']:.1f} / {r.abs_ms['p99']:.1f}")
    row(f"added p50 ms (median of {args.rounds})", lambda r: f"{r.added_ms['p50']:.2f}")
    row(f"added p99 ms (median of {args.rounds})", lambda r: f"{r.added_ms['p99']:.2f}")
    row("gateway RSS MiB start / peak / after", lambda r: f"{r.rss_mib['start']:.0f} / {r.rss_mib['peak']:.0f} / "
                                                        f"{r.rss_mib['after']:.0f}")
    row("steps / calls", lambda r: f"{r.report.steps} / {r.report.calls}")
    row("faults planned (500/reset/stall)", lambda r: "/".join(str(r.report.faults_planned.get(k, 0))
                                                            for k in ("http500", "reset", "stall")))
    row("distinct calls the upstream faulted", lambda r: "/".join(str(r.upstream_faults.get(k, 0))
                                                       for k in ("http500", "reset", "stall")))
    for name in ("lost", "duplicated", "misattributed", "unmarked", "fault_not_errored", "clean_errored",
                 "tokens_wrong", "client_wrong"):
        row(name, lambda r, n=name: getattr(r.report, n))
    row("gateway late / refused steps", lambda r: f"{r.gateway_stats.get('late_steps')} / "
                                                  f"{r.gateway_stats.get('refused_calls')}")
    console.print(t)
    for r in results:
        for ex in r.report.examples:
            console.print(f"[red]{r.store}: {ex}[/red]")


async def main_async(args: argparse.Namespace) -> list[StoreResult]:
    cmd = [sys.executable, "-c", UPSTREAM_SCRIPT, str(args.seed), str(args.fault_rate), str(args.stall)]
    results = []
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=not sys.stdout.isatty())
    with process(cmd, "faulty upstream", 1) as (_, (upstream_url,)), tempfile.TemporaryDirectory() as tmp, bar:
        for store in args.stores:
            results.append(await run_store(store, upstream_url, args, bar, Path(tmp)))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--sessions", type=int, default=64, help="concurrent sessions (each makes its calls in turn)")
    p.add_argument("--fault-rate", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1.0, help="the gateway's upstream timeout (s)")
    p.add_argument("--stall", type=float, default=None, help="how long a stall lasts (default 3 x --timeout)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved direct/gateway rounds")
    p.add_argument("--direct-share", type=float, default=0.25,
                   help="direct baseline calls per round, as a share of the round's gateway calls")
    p.add_argument("--stores", nargs="+", default=["memory", "sqlite"], choices=["memory", "sqlite"])
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if args.calls < args.sessions or args.sessions < 1:
        p.error(f"--calls ({args.calls}) must be at least --sessions ({args.sessions}), and --sessions >= 1")
    args.stall = args.stall if args.stall is not None else 3 * args.timeout
    if args.stall <= args.timeout:
        p.error(f"--stall ({args.stall}) must exceed --timeout ({args.timeout}): a stall is a call the gateway "
                "gives up on")
    results = asyncio.run(main_async(args))
    show(results, args)
    if args.json is not None:
        args.json.write_text(json.dumps([{**r.__dict__, "report": r.report.model_dump()} for r in results],
                                        indent=1, default=str))
    return 0 if all(r.report.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

