"""benchmarks/rollout_engine.py runs as typed on tiny-random (ours vs HF sequential; vLLM has no CPU kernel for
tiny-random's head size and is refused by name)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rollout_engine.py"


def test_rollout_engine_benchmark_runs_on_tiny_random(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-random", "--engines", "ours,hf",
                           "--loads", "grpo,multiturn", "--repeats", "1", "--threads", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    text = json.dumps(data)
    assert "ours" in text and "hf" in text and "tok_s" in text
    refused = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-random", "--engines", "vllm"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "tiny-random" in (refused.stdout + refused.stderr)
