"""How often a multi-turn trajectory packs into one train row: re-tokenized history vs token-exact turns.

Runs the FrozenLake agent (and, with --workflow, a multi-turn workflow) on the embedded SmolLM2-135M through the
gateway, once with the history re-tokenized by the server's chat template (`exact_turns` off) and once with the
gateway's `rllm_continue` hints (on, the default for rllm's policy server), at the training temperature, and
prints the share of trajectories that pack into a single row (`pack_trajectory`), side by side.

    python benchmarks/multi_turn_packing.py --tasks 12 --max-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--benchmark", default="frozenlake")
    parser.add_argument("--workflow", default=None, help="e.g. refinement (instead of the benchmark's agent)")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()

    from rllm_envs.benchmarks import get_benchmark
    from rllm_rollout.engine import run_episodes
    from rllm_rollout.gateway import UpstreamConfig, start_gateway
    from rllm_serve import start_policy_server
    from rllm_train.packing import pack_trajectory

    bench = get_benchmark(args.benchmark)
    tasks = bench.load("test", max_examples=args.tasks, seed=0)
    agent = bench.default_rollout()
    if args.workflow:
        from rllm_envs.workflows import get_workflow

        agent = get_workflow(args.workflow)
    server = start_policy_server(args.model)
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    try:
        for exact in (False, True):
            gateway = start_gateway([UpstreamConfig(url=server.base_url, inject_token_ids=True, exact_turns=exact)])
            started = time.monotonic()
            try:
                episodes = asyncio.run(run_episodes(agent, tasks, gateway=gateway, model=server.model_name,
                                                    concurrency=len(tasks), sampling=sampling, progress=False))
            finally:
                gateway.stop()
            trajs = [t for e in episodes for t in e.trajectories if len(t.steps) > 1]
            single = sum(len(pack_trajectory(t, 1.0)[0]) == 1 for t in trajs)
            turns = sum(len(t.steps) for t in trajs)
            label = "exact turns " if exact else "re-tokenized"
            print(f"{label}: {single}/{len(trajs)} multi-turn trajectories in one row "
                  f"({single / max(len(trajs), 1):.1%}), {turns} turns, {time.monotonic() - started:.0f} s")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
