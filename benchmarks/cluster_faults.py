"""rllm eval and rllm train across a simulated cluster, and faults injected during a training run (issue 34).

    python benchmarks/cluster_faults.py                       # as root: tiny-random, about 10 minutes
    python benchmarks/cluster_faults.py --model smollm2-135m  # the embedded model on the policy host

Hosts (network namespaces on one bridge, rllm_testing/netns_cluster.py, addresses from 198.18.0.0/15, no route
out): `head` (the trainer and the eval driver, the Ray head with no CPUs for actors), `worker1` and `worker2`
(Ray nodes, 1 CPU each: episodes run there), `gateway` (`rllm gateway`, SQLite store, upstream the policy host),
`policy` (`rllm serve --admin-token`: the trainer pushes each step's weights to it).

1. **Scaling**: `rllm eval` with 1 and with 2 worker hosts (each worker host pinned to a core of its own), repeats
   interleaved, medians printed, for two workloads: the terminal references (sandbox + verifier on the worker
   hosts) and the arithmetic agent on the policy host's model (bound by the policy host, which does not grow).
2. **Faults**: one `rllm train` run (batch × group episodes per step, a checkpoint every step); at chosen steps,
   while that step's rollouts are running (the gateway has recorded some of its calls), one fault:
   a worker host killed (and rebooted 10 s later), a worker host partitioned for 10 s and healed, the gateway
   host's process restarted (same SQLite file), the policy server killed and started again, the trainer killed
   (then `rllm train --resume`). The table says what the run did, the counts before and after, and what was lost
   or duplicated: every trained step must hold batch × group episodes, no Step id may appear twice, and the
   gateway's own count of recorded calls must equal the run's plus the calls of attempts that never reached it
   (a killed worker's or trainer's in-flight episodes, left untaken in the store).

Results: benchmarks/results/cluster_faults.json and the table on stdout. CPU flags are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rllm_core.cpu_features import matmul_flags
from rllm_testing.cluster_services import HOSTS, ClusterServices
from rllm_testing.netns_cluster import NetnsCluster

FAULTS = ("worker_killed", "worker_partitioned", "gateway_restarted", "policy_restarted", "trainer_killed")


def _train_records(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r for r in records if r["kind"] == "train"]


def trained_steps(run: Path) -> int:
    """Steps the run has trained (its metrics only: what the fault loop polls)."""
    return len({r["step"] for r in _train_records(run)})


def run_counts(run: Path) -> dict[str, Any]:
    """What the run's files hold: trained steps, episodes, calls (Steps), errors, Step ids seen twice."""
    steps = _train_records(run)
    episodes, calls, errors, ids = 0, 0, 0, []
    per_step, details = {}, {}
    for path in sorted((run / "episodes").glob("step_*.jsonl")):
        eps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        per_step[path.stem] = len(eps)
        episodes += len(eps)
        errors += sum(1 for e in eps if e.get("error"))
        step_calls = sum(len(t["steps"]) for e in eps for t in e["trajectories"])
        kinds: dict[str, int] = {}
        for e in eps:
            if e.get("error"):
                kind = e["error"].strip().splitlines()[-1].split(":")[0]
                kinds[kind] = kinds.get(kind, 0) + 1
            for t in e["trajectories"]:
                calls += len(t["steps"])
                ids.extend(s["id"] for s in t["steps"])
        details[path.stem] = {"episodes": len(eps), "calls": step_calls, "errors": kinds}
    return {"trained_steps": len({s["step"] for s in steps}), "episodes": episodes, "calls": calls,
            "errors": errors, "duplicated_calls": len(ids) - len(set(ids)), "episodes_per_step": per_step,
            "steps": details, "ray": {k: v for k, v in (steps[-1] if steps else {}).items() if k.startswith("ray/")}}


SCALING_WORKLOADS = {
    # the built-in terminal tasks' references: a sandbox and a verifier per episode, all on the worker hosts
    "terminal-oracle": ["terminal", "--agent", "oracle", "--split", "train", "--attempts", "3"],
    # the default arithmetic agent on the policy host's model: every call crosses to the policy and gateway hosts
    "arithmetic-llm": ["arithmetic", "--split", "train", "-n", "64", "--max-tokens", "32"],
}


def scaling(svc: ClusterServices, repeats: int) -> dict[str, Any]:
    """Eval wall time with 1 and 2 worker hosts (each pinned to a core of its own), repeats interleaved."""
    out: dict[str, Any] = {}
    for workload, flags in SCALING_WORKLOADS.items():
        walls: dict[int, list[float]] = {1: [], 2: []}
        episodes = 0
        for r in range(repeats):
            for workers in (1, 2):
                run = svc.workdir / f"eval-{workload}-{workers}-{r}"
                proc = svc.rllm("head", ["eval", *flags, "--gateway", svc.gateway_url, "--rollout-workers",
                                         str(workers), "--ray-address", svc.ray_address, "--concurrency", "16",
                                         "-o", str(run), "--no-progress"])
                if proc.returncode:
                    raise SystemExit(f"eval failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                summary = json.loads((run / "summary.json").read_text())
                episodes = summary["n_episodes"]
                walls[workers].append(summary["wall_time_s"])
                print(f"  {workload}, {workers} worker host(s), repeat {r}: {summary['wall_time_s']:.1f} s for "
                      f"{episodes} episodes, by node {summary['config']['ray']['by_node']}", flush=True)
        med = {w: statistics.median(v) for w, v in walls.items()}
        out[workload] = {"episodes": episodes, "repeats": repeats, "wall_s": walls, "median_wall_s": med,
                         "episodes_per_s": {w: episodes / m for w, m in med.items()},
                         "speedup_2_over_1": med[1] / med[2]}
    return out


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


def faults(svc: ClusterServices, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One training run; each fault at its step while that step's rollouts run (module docstring)."""
    run = svc.workdir / "train"
    cfg = svc.workdir / "train.yaml"
    cfg.write_text(json.dumps({"backend_options": {"policy_server": svc.policy_url}}))
    per_step = args.batch_size * args.group_size
    train_args = ["train", "arithmetic", "--model", args.model, "--config", str(cfg), "--output", str(run),
                  "--max-steps", str(args.steps), "--batch-size", str(args.batch_size), "--group-size",
                  str(args.group_size), "--max-tokens", "32", "--concurrency", "8", "--rollout-workers", "2",
                  "--ray-address", svc.ray_address, "--gateway", svc.gateway_url, "--save-every", "1",
                  "--eval-examples", "0", "--no-progress", "--lr", "1e-4"]
    gateway_start = svc.gateway_stats()["recorded_steps"]  # calls the scaling evals recorded before this run
    trainer = svc.spawn_rllm("head", train_args, "trainer")
    plan = {step: name for step, name in zip(range(2, 2 + 2 * len(FAULTS), 2), args.faults, strict=False)}
    rows = []
    for step, name in sorted(plan.items()):
        _wait(lambda s=step, t=trainer: trained_steps(run) >= s - 1 or t.poll() is not None, 600,
              f"step {step - 1} to finish")
        if trainer.poll() is not None:
            raise SystemExit(f"the trainer ended (exit {trainer.returncode}) before the {name} fault")
        base_calls = svc.gateway_stats()["recorded_steps"]
        _wait(lambda b=base_calls: svc.gateway_stats()["recorded_steps"] >= b + per_step // 4, 300,
              f"step {step}'s rollouts to start")
        before, gw_before = run_counts(run), svc.gateway_stats()
        started = time.monotonic()
        what = inject(svc, name, trainer)
        if name == "trainer_killed":
            trainer.wait(timeout=60)
            trainer = svc.spawn_rllm("head", ["train", "--resume", str(run), "--no-progress"], "trainer-resumed")
            what += "; `rllm train --resume` started"
        _wait(lambda s=step, t=trainer: trained_steps(run) >= s or t.poll() is not None, 900,
              f"step {step} to finish after the {name} fault")
        after, gw_after = run_counts(run), svc.gateway_stats()
        rows.append({"fault": name, "step": step, "injected_after_calls": gw_before["recorded_steps"] - base_calls,
                     "recovered_s": round(time.monotonic() - started, 1), "what": what,
                     "before": _brief(before, gw_before), "after": _brief(after, gw_after),
                     "step_episodes": after["episodes_per_step"].get(f"step_{step}"),
                     "in_step": after["steps"].get(f"step_{step}"),
                     "lost": per_step - after["episodes_per_step"].get(f"step_{step}", 0),
                     "duplicated_calls": after["duplicated_calls"]})
        print(f"  {name} at step {step}: {what}; step {step} done {rows[-1]['recovered_s']} s later", flush=True)
    code = trainer.wait(timeout=1800)
    final, gw = run_counts(run), svc.gateway_stats()
    gw["recorded_steps"] -= gateway_start
    rows.append({"fault": "end of run", "exit_code": code, "after": _brief(final, gw),
                 "missing_episodes": {k: per_step - v for k, v in final["episodes_per_step"].items() if v != per_step},
                 "duplicated_calls": final["duplicated_calls"],
                 "untaken_calls_in_gateway": gw["stored_steps"],
                 "gateway_minus_run_minus_untaken": gw["recorded_steps"] - final["calls"] - gw["stored_steps"]})
    for row in rows[:-1]:  # the gateway's counts since this run started
        row["before"]["gateway_calls"] -= gateway_start
        row["after"]["gateway_calls"] -= gateway_start
    return rows


def _brief(counts: dict[str, Any], gw: dict[str, Any]) -> dict[str, Any]:
    return {"trained_steps": counts["trained_steps"], "episodes": counts["episodes"], "calls": counts["calls"],
            "errors": counts["errors"], "gateway_calls": gw["recorded_steps"], "gateway_untaken": gw["stored_steps"],
            "ray": counts["ray"]}


def inject(svc: ClusterServices, name: str, trainer: Any) -> str:
    """Inject one fault now; what was done, in words."""
    cluster = svc.cluster
    if name == "worker_killed":
        killed = cluster.kill_host("worker1")
        time.sleep(10)
        svc.start_ray_worker("worker1")
        return f"worker1 killed ({killed} processes), its Ray node started again 10 s later"
    if name == "worker_partitioned":
        cluster.partition("worker2")
        time.sleep(10)
        cluster.heal("worker2")
        return "worker2 cut off for 10 s (its switch port drops every frame), then healed"
    if name == "gateway_restarted":
        down = svc.restart("gateway")
        return f"gateway process killed and started again on the same SQLite file ({down:.1f} s down)"
    if name == "policy_restarted":
        down = svc.restart("policy")
        return f"policy server killed and started again ({down:.1f} s down; it came back with its base weights)"
    if name == "trainer_killed":
        os.killpg(trainer.pid, signal.SIGKILL)
        return "trainer process killed (SIGKILL)"
    raise ValueError(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--faults", nargs="*", default=list(FAULTS), choices=FAULTS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/cluster_faults.json")
    ap.add_argument("--workdir", default=None, help="where the run, logs and the gateway's file go (default: temp)")
    args = ap.parse_args()
    args.steps = max(args.steps, 2 * len(args.faults) + 2)
    import tempfile

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rllm-cluster-")).resolve()
    print(f"CPU flags: {matmul_flags()} · {os.cpu_count()} cores · workdir {workdir}", flush=True)
    result: dict[str, Any] = {"cpu_flags": matmul_flags(), "cores": os.cpu_count(), "model": args.model}
    with NetnsCluster(list(HOSTS), log_dir=workdir / "logs") as cluster:
        svc = ClusterServices(cluster, workdir, model=args.model)
        try:
            t0 = time.monotonic()
            svc.start_policy()
            svc.start_gateway()
            svc.start_ray(["worker1", "worker2"])
            result["layout"] = cluster.layout()
            result["startup_s"] = round(time.monotonic() - t0, 1)
            print("layout:", *(f"{h['host']}={h['address']}" for h in result["layout"]), flush=True)
            if not args.skip_scaling:
                result["scaling"] = scaling(svc, args.repeats)
                for workload, s in result["scaling"].items():
                    print(f"{workload}: {s['episodes']} episodes, median of {args.repeats}: 1 worker host "
                          f"{s['median_wall_s'][1]:.1f} s ({s['episodes_per_s'][1]:.2f}/s), 2 worker hosts "
                          f"{s['median_wall_s'][2]:.1f} s ({s['episodes_per_s'][2]:.2f}/s), "
                          f"×{s['speedup_2_over_1']:.2f}", flush=True)
            if args.faults:
                result["faults"] = faults(svc, args)
        finally:
            svc.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    if args.faults:
        print_table(result["faults"])
    print(f"results → {args.out}")


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| fault | at | what the run did | episodes / calls before → after (gateway calls) | lost | dup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["fault"] == "end of run":
            a = r["after"]
            print(f"| end of run (exit {r['exit_code']}) | | {a['trained_steps']} steps trained | {a['episodes']} / "
                  f"{a['calls']} ({a['gateway_calls']}, {r['untaken_calls_in_gateway']} untaken) | "
                  f"{sum(r['missing_episodes'].values())} | {r['duplicated_calls']} |")
            continue
        b, a, own = r["before"], r["after"], r["in_step"] or {}
        print(f"| {r['fault']} | step {r['step']}, after {r['injected_after_calls']} of its calls | {r['what']}; "
              f"step {r['step']}: {own.get('episodes')} episodes, {own.get('calls')} calls, errored "
              f"{own.get('errors') or 'none'}; ray {a['ray']} | {b['episodes']} / {b['calls']} "
              f"({b['gateway_calls']}) → {a['episodes']} / {a['calls']} ({a['gateway_calls']}) | "
              f"{r['lost']} | {r['duplicated_calls']} |")


if __name__ == "__main__":
    main()
