"""How idle OpenMP worker threads wait, set before torch (or numba) loads its OpenMP runtime.

torch's CPU kernels run on an OpenMP team: between two parallel regions the workers either spin (fast to wake,
but a spinning thread takes a core from the event loop, the tokenizer or a trainer sharing 2 cores) or sleep
(free, but waking one costs ~90 us here). A decode step of SmolLM2 is ~210 small parallel regions, so sleeping
workers (`OMP_WAIT_POLICY=PASSIVE`, what rllm set before) cost ~20 ms of a 65 ms step at 8 rows. A bounded spin
keeps the workers awake across the gaps between one layer's kernels and lets them sleep when the engine idles:
measured at 8 rows, PASSIVE 88 ms a step, GOMP_SPINCOUNT=20000 66 ms, always-spinning (ACTIVE) 64 ms.
"""

from __future__ import annotations

import os

__all__ = ["BOUNDED_SPINCOUNT", "bound_openmp_spinning"]

BOUNDED_SPINCOUNT = "20000"
"""libgomp busy-wait iterations before an idle worker sleeps (its default is 300000; PASSIVE means 0)."""


def bound_openmp_spinning() -> None:
    """Set GNU OpenMP's spin count unless the user chose a wait policy; a no-op once the runtime has loaded."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = BOUNDED_SPINCOUNT


bound_openmp_spinning()  # importing this module is enough (scripts import it before torch)
