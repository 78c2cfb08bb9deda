"""What a gateway hop costs: the same load direct to the fake upstream, through rllm's gateway, and through
`rllm-model-gateway` (rLLM's own, FastAPI + httpx), side by side in one run.

Each gateway runs in its own subprocess; its CPU time (user + system, from psutil) is read before and after
each load phase, so "CPU ms per call" is the gateway's own cost, not the client's or the upstream's. Latency
is measured by an aiohttp client; "added" latency is the p50/p99 over the direct run of the same mode.

    python benchmarks/gateway_overhead.py --calls 2000     # 2,000 calls per target, split over 4 modes
    python benchmarks/gateway_overhead.py --quick          # 200 calls per target

If rllm-model-gateway is not installed or does not start, the script says so and reports ours alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp
import psutil
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rllm_core.net import free_port

MODES = [(1, False), (1, True), (32, False), (32, True)]
"""(concurrency, streaming) pairs; each gets calls / 4 calls per target."""

WARMUP_CALLS = 40

MESSAGES = [
    {"role": "system", "content": "You are a careful assistant. Answer briefly. " * 4},
    {"role": "user", "content": "What is the capital of France? Explain your reasoning step by step."},
]

UPSTREAM_SCRIPT = """
import sys, threading
from rllm_testing.fake_upstream import start_fake_upstream
with start_fake_upstream() as up:
    print(up.url, flush=True)
    threading.Event().wait()
"""

console = Console(width=None if sys.stdout.isatty() else 130)


@dataclass
class Result:
    target: str
    concurrency: int
    stream: bool
    latencies_s: list[float]
    cpu_s: float | None
    errors: int

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")

    @property
    def cpu_ms_per_call(self) -> float | None:
        return None if self.cpu_s is None else self.cpu_s * 1000 / max(1, len(self.latencies_s))


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> bool:
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


@contextmanager
def subprocess_server(cmd: list[str], health_url: str, name: str) -> Iterator[subprocess.Popen[bytes] | None]:
    env = {**os.environ, "RLLM_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        if not wait_http(health_url, proc):
            err = b""
            if proc.poll() is not None and proc.stderr is not None:
                err = proc.stderr.read()[-1500:]
            console.print(f"[red]{name} did not start ({' '.join(cmd)}): {err.decode(errors='replace')}[/red]")
            yield None
        else:
            yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def one_call(session: aiohttp.ClientSession, url: str, stream: bool) -> float:
    body = {"model": "m", "messages": MESSAGES, "stream": stream, "max_tokens": 64}
    t0 = time.perf_counter()
    async with session.post(url, json=body) as resp:
        data = await resp.read()
        if resp.status != 200 or (stream and b"[DONE]" not in data):
            raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")
    return time.perf_counter() - t0


async def run_load(base_urls: list[str], calls: int, concurrency: int, stream: bool,
                   progress: Progress, label: str) -> tuple[list[float], int]:
    task = progress.add_task(label, total=calls)
    latencies: list[float] = []
    errors = 0
    counter = iter(range(calls))
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(w: int) -> None:
            nonlocal errors
            url = base_urls[w % len(base_urls)] + "/chat/completions"
            for _ in counter:
                try:
                    latencies.append(await one_call(session, url, stream))
                except Exception:
                    errors += 1
                progress.advance(task)

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return latencies, errors


def cpu_seconds(proc: subprocess.Popen[bytes] | None) -> float | None:
    if proc is None:
        return None
    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


def bench_target(name: str, urls_for: Callable[[int], list[str]], proc: subprocess.Popen[bytes] | None,
                 calls: int, progress: Progress) -> list[Result]:
    results = []
    per_mode = max(1, calls // len(MODES))
    asyncio.run(run_load(urls_for(4), WARMUP_CALLS, 4, False, progress, f"{name}: warm-up"))
    for conc, stream in MODES:
        before = cpu_seconds(proc)
        lat, err = asyncio.run(run_load(urls_for(conc), per_mode, conc, stream, progress,
                                        f"{name}: {conc} concurrent, {'stream' if stream else 'json'}"))
        after = cpu_seconds(proc)
        cpu = None if before is None or after is None else after - before
        results.append(Result(name, conc, stream, lat, cpu, err))
    return results


def sessions(base: str, n: int) -> list[str]:
    return [f"{base}/sessions/bench-{i}/v1" for i in range(n)]


def recorded_steps(base: str, n: int = 32) -> tuple[int, int]:
    """(Steps our gateway recorded over the bench sessions, how many carry the server's ids and logprobs):
    the cost above is the cost of really recording every call."""
    import json
    import urllib.request

    total = trainable = 0
    for i in range(n):
        with urllib.request.urlopen(f"{base}/sessions/bench-{i}/steps", timeout=30) as r:
            steps = json.loads(r.read())
        total += len(steps)
        trainable += sum(1 for s in steps if s["token_source"] == "server" and s["logprobs"] and not s["error"])
    return total, trainable


def report(all_results: dict[str, list[Result]]) -> None:
    direct = {(r.concurrency, r.stream): r for r in all_results["direct"]}
    table = Table(title="gateway overhead (added latency vs direct; gateway process CPU per call)")
    for col in ("target", "mode", "calls", "errors", "p50 ms", "p99 ms", "added p50", "added p99", "CPU ms/call"):
        table.add_column(col, justify="right")
    for name, results in all_results.items():
        for r in results:
            d = direct[(r.concurrency, r.stream)]
            add50 = "" if name == "direct" else f"{r.pct(0.5) - d.pct(0.5):.2f}"
            add99 = "" if name == "direct" else f"{r.pct(0.99) - d.pct(0.99):.2f}"
            cpu = "" if r.cpu_ms_per_call is None else f"{r.cpu_ms_per_call:.3f}"
            table.add_row(name, f"c={r.concurrency}/{'stream' if r.stream else 'json'}", str(len(r.latencies_s)),
                          str(r.errors), f"{r.pct(0.5):.2f}", f"{r.pct(0.99):.2f}", add50, add99, cpu)
    console.print(table)
    ours, theirs = all_results.get("rllm-gateway"), all_results.get("rllm-model-gateway")
    if not ours:
        return
    if not theirs:
        console.print("[yellow]rllm-model-gateway was not measured: no ratio.[/yellow]")
        return
    for a, b in zip(ours, theirs, strict=True):
        ca, cb = a.cpu_ms_per_call or 0.0, b.cpu_ms_per_call or float("nan")
        console.print(f"c={a.concurrency} {'stream' if a.stream else 'json  '}: CPU ours/theirs = "
                      f"{ca / cb:.2f}  ({ca:.3f} vs {cb:.3f} ms/call)")
    tot_a = sum(r.cpu_s or 0 for r in ours) / max(1, sum(len(r.latencies_s) for r in ours))
    tot_b = sum(r.cpu_s or 0 for r in theirs) / max(1, sum(len(r.latencies_s) for r in theirs))
    ratio = tot_a / tot_b if tot_b else float("nan")
    verdict = "[green]meets[/green]" if ratio <= 0.5 else "[red]misses[/red]"
    console.print(f"overall CPU per call: ours {tot_a * 1000:.3f} ms, theirs {tot_b * 1000:.3f} ms, "
                  f"ratio {ratio:.2f} ({verdict} the goal of ≤ 0.5)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls per target, split over the 4 modes")
    ap.add_argument("--quick", action="store_true", help="200 calls per target")
    ap.add_argument("--skip-peer", action="store_true", help="do not try rllm-model-gateway")
    args = ap.parse_args()
    calls = 200 if args.quick else args.calls
    py = sys.executable
    up_proc = subprocess.Popen([py, "-c", UPSTREAM_SCRIPT], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        upstream = (up_proc.stdout.readline() if up_proc.stdout else "").strip()
        if not upstream.startswith("http"):
            raise SystemExit("the fake upstream did not start")
        results: dict[str, list[Result]] = {}
        with Progress(console=console, transient=True) as progress:
            results["direct"] = bench_target("direct", lambda n: [upstream + "/v1"], None, calls, progress)
            port = free_port("127.0.0.1")
            ours_cmd = [py, "-m", "rllm", "gateway", "--upstream", upstream + "/v1", "--port", str(port)]
            with subprocess_server(ours_cmd, f"http://127.0.0.1:{port}/health", "rllm gateway") as proc:
                if proc is not None:
                    results["rllm-gateway"] = bench_target(
                        "rllm-gateway", lambda n: sessions(f"http://127.0.0.1:{port}", n), proc, calls, progress)
                    sent = sum(len(r.latencies_s) + r.errors for r in results["rllm-gateway"]) + WARMUP_CALLS
                    total, trainable = recorded_steps(f"http://127.0.0.1:{port}")
                    console.print(f"rllm-gateway recorded {total} Steps for {sent} calls; {trainable} with the "
                                  "server's token ids and logprobs")
            if not args.skip_peer:
                try:
                    import rllm_model_gateway  # noqa: F401
                except ImportError:
                    console.print("[red]rllm-model-gateway is not installed: pip install rllm-model-gateway "
                                  "(or its wheel) to compare; reporting ours alone.[/red]")
                else:
                    port2 = free_port("127.0.0.1")
                    peer_cmd = [py, "-m", "rllm_model_gateway", "--host", "127.0.0.1", "--port", str(port2),
                                "--worker", upstream + "/v1", "--store", "memory", "--log-level", "warning"]
                    with subprocess_server(peer_cmd, f"http://127.0.0.1:{port2}/health",
                                           "rllm-model-gateway") as proc:
                        if proc is not None:
                            results["rllm-model-gateway"] = bench_target(
                                "rllm-model-gateway", lambda n: sessions(f"http://127.0.0.1:{port2}", n), proc,
                                calls, progress)
        report(results)
    finally:
        up_proc.terminate()
        up_proc.wait(10)


if __name__ == "__main__":
    main()
