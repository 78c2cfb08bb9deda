"""CPU runtime settings that must be in place before torch (or numba) loads its OpenMP and oneDNN runtimes.

**How idle OpenMP workers wait.** torch's CPU kernels run on an OpenMP team: between two parallel regions the
workers either spin (fast to wake, but a spinning thread takes a core from the event loop, the tokenizer or a
trainer sharing 2 cores) or sleep (free, but waking one costs ~90 us here). A decode step of SmolLM2 is ~210
small parallel regions, so sleeping workers (`OMP_WAIT_POLICY=PASSIVE`, what rllm set before) cost ~20 ms of a
65 ms step at 8 rows. A bounded spin keeps the workers awake across the gaps between one layer's kernels and lets
them sleep when the engine idles: measured at 8 rows, PASSIVE 88 ms a step, GOMP_SPINCOUNT=20000 66 ms,
always-spinning (ACTIVE) 64 ms.

**How many oneDNN primitives stay cached.** oneDNN (torch's CPU matmul library, also behind bf16 autocast and
the server's packed linears) caches one compiled primitive per distinct problem shape, up to 1024 by default.
Training and serving see a new shape at almost every step (packed micro-batches and continuous batches vary in
length), so the cache, and the scratch memory its primitives hold, grew for the whole run: the README's main job
crept +8 to +10 % in RSS from step 5 to step 40 while its Python objects and workload stayed flat (glibc's
in-use heap 1.91 → 2.13 GB over 30 steps). Capped at 32 the same run stays flat (in-use 1.54 → 1.63 GB, RSS
3.27 → 3.19 GiB) at the same speed (312 vs 321 s for 30 steps); `benchmarks/train_memory.py` measures it.

Both are set only when the user has not chosen: `OMP_WAIT_POLICY` / `GOMP_SPINCOUNT` and
`ONEDNN_PRIMITIVE_CACHE_CAPACITY` in the environment win.
"""

from __future__ import annotations

import os

__all__ = ["BOUNDED_SPINCOUNT", "ONEDNN_CACHE_CAPACITY", "configure_cpu_runtime"]

BOUNDED_SPINCOUNT = "20000"
"""libgomp busy-wait iterations before an idle worker sleeps (its default is 300000; PASSIVE means 0)."""

ONEDNN_CACHE_CAPACITY = "32"
"""oneDNN primitives kept compiled (its default is 1024): enough for one step's shapes, not a run's history."""


def configure_cpu_runtime() -> None:
    """Bound OpenMP spinning and oneDNN's primitive cache unless the user chose; a no-op once they have loaded."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = BOUNDED_SPINCOUNT
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY)


configure_cpu_runtime()  # importing this module is enough (scripts import it before torch)
