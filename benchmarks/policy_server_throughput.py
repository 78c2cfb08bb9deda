"""Throughput of the local policy server vs. sequential HF `generate`, same model, same prompts, one run.

    python benchmarks/policy_server_throughput.py --model smollm2-135m      # ~2 min on 2 CPU cores
    python benchmarks/policy_server_throughput.py --model tiny-random       # seconds

Baseline: one `model.generate` per request, one request at a time (what "just call generate" gives).
Server: the same requests sent concurrently over HTTP to `start_policy_server` (continuous batching).
Both sample at temperature 1 with exactly `--new-tokens` tokens per request (EOS ignored), so the token
counts are equal; the ratio of tokens/s is the figure of merit (goal: >= 4x at 16 concurrent requests).
"""

from __future__ import annotations

import os

import rllm_core.cpu_runtime  # noqa: F401  (bounds OpenMP spinning and the oneDNN cache before torch loads)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import asyncio
import json
import time

import httpx
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rllm_serve import LoadedModel, load_model, start_policy_server

TOPICS = ["the moon", "prime numbers", "bread", "rivers", "chess", "volcanoes", "bees", "the printing press",
          "glaciers", "jazz", "photosynthesis", "bridges", "owls", "the internet", "tea", "comets"]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Write a short paragraph about {TOPICS[i % len(TOPICS)]}"
                                          + " in simple words" * (i % 4) + "."}] for i in range(n)]


def sequential_generate(loaded: LoadedModel, chats: list[list[dict[str, str]]], new_tokens: int) -> tuple[int, float]:
    """One HF generate call per request, one after the other; returns (tokens, seconds)."""
    tok, model = loaded.tokenizer, loaded.model
    encoded = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    ids = [torch.tensor([tok.encode(t, add_special_tokens=False)]) for t in encoded]
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_p=1.0,
              top_k=0, pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        model.generate(ids[0], **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        produced, start = 0, time.perf_counter()
        with Progress(transient=True) as bar:
            task = bar.add_task("sequential generate", total=len(ids))
            for x in ids:
                out = model.generate(x, **kw)
                produced += out.shape[1] - x.shape[1]
                bar.advance(task)
    return produced, time.perf_counter() - start


async def concurrent_server(base_url: str, chats: list[list[dict[str, str]]], new_tokens: int) -> tuple[int, float]:
    """All requests at once against the server; returns (tokens, seconds)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await client.post("/chat/completions", json={"messages": chats[0], "max_tokens": 2})  # warm-up

        async def one(c: list[dict[str, str]]) -> int:
            r = await client.post("/chat/completions", json={"messages": c, "max_tokens": new_tokens,
                                                            "ignore_eos": True, "temperature": 1.0})
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])

        start = time.perf_counter()
        counts = await asyncio.gather(*(one(c) for c in chats))
    return sum(counts), time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny-random | a path")
    ap.add_argument("--requests", type=int, default=16, help="concurrent requests (and sequential ones)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    loaded = load_model(args.model)
    chats = prompts(args.requests)
    seq_tokens, seq_s = sequential_generate(loaded, chats, args.new_tokens)
    with start_policy_server(loaded, max_batch_size=max(32, args.requests), threads=args.threads) as server:
        srv_tokens, srv_s = asyncio.run(concurrent_server(server.base_url, chats, args.new_tokens))
    seq_tps, srv_tps = seq_tokens / seq_s, srv_tokens / srv_s
    table = Table(title=f"{args.model}: {args.requests} requests x {args.new_tokens} new tokens, "
                        f"{torch.get_num_threads()} torch threads")
    for col in ("mode", "tokens", "seconds", "tokens/s"):
        table.add_column(col, justify="right")
    table.add_row("HF generate, sequential", str(seq_tokens), f"{seq_s:.1f}", f"{seq_tps:.1f}")
    table.add_row(f"policy server, {args.requests} concurrent", str(srv_tokens), f"{srv_s:.1f}", f"{srv_tps:.1f}")
    console.print(table)
    console.print(f"speed-up: [bold]{srv_tps / seq_tps:.2f}x[/bold]")
    print(json.dumps({"model": args.model, "requests": args.requests, "new_tokens": args.new_tokens,
                      "threads": torch.get_num_threads(), "sequential_tok_s": round(seq_tps, 2),
                      "server_tok_s": round(srv_tps, 2), "ratio": round(srv_tps / seq_tps, 2)}))


if __name__ == "__main__":
    main()
