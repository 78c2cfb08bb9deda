"""How the rest of rllm reaches Harbor task sets: `harbor:PATH` benchmark names.

`rllm_core.benchmarks.registry.get_benchmark` builds `PREFIX:ARG` names it has no registered benchmark for through
a factory named in its prefix table; for "harbor" that is `harbor_benchmark` here. Task sets that are built in
under a name of their own (`terminal`) register through `rllm_register_benchmarks` instead.
"""

from __future__ import annotations

from rllm_core.errors import BenchmarkError
from rllm_envs.harbor.benchmark import HarborBenchmark

__all__ = ["harbor_benchmark"]


def harbor_benchmark(path: str) -> HarborBenchmark:
    """The benchmark for `harbor:PATH`; the tasks are checked now, so a malformed set fails before any episode."""
    if not path.strip():
        raise BenchmarkError("harbor:PATH needs a path: a Harbor task directory, or a directory of them "
                             "(e.g. `rllm eval harbor:./tasks --agent oracle`)")
    bench = HarborBenchmark(path.strip())
    bench.harbor_tasks()
    return bench
