"""Registers the built-in `terminal` benchmark and the `harbor:PATH` benchmark source, both run by the built-in
terminal agent by default; nothing heavy is imported until the registry asks for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rllm_core.errors import BenchmarkError
from rllm_core.hookspecs import hookimpl
from rllm_rollout.benchmarks.registry import BenchmarkSourceSpec

if TYPE_CHECKING:
    from rllm_envs.harbor.benchmark import HarborBenchmark

__all__ = ["harbor_benchmark", "rllm_register_benchmark_sources", "rllm_register_benchmarks"]


@hookimpl
def rllm_register_benchmarks() -> list[Any]:
    from rllm_envs.terminal.benchmark import TerminalBenchmark

    return [TerminalBenchmark()]


def _terminal_agent() -> Any:
    from rllm_envs.terminal.agent import terminal_agent

    return terminal_agent


def harbor_benchmark(path: str) -> HarborBenchmark:
    """The benchmark for `harbor:PATH`, run by the terminal agent unless --agent says otherwise; the tasks are
    checked now, so a malformed set fails before any episode."""
    from rllm_envs.harbor.benchmark import HarborBenchmark

    if not path.strip():
        raise BenchmarkError("harbor:PATH needs a path: a Harbor task directory, or a directory of them "
                             "(e.g. `rllm eval harbor:./tasks --agent oracle`)")
    bench = HarborBenchmark(path.strip(), agent=_terminal_agent)
    bench.harbor_tasks()
    return bench


@hookimpl
def rllm_register_benchmark_sources() -> list[BenchmarkSourceSpec]:
    return [BenchmarkSourceSpec(prefix="harbor", factory=harbor_benchmark,
                                description="a Harbor task directory, or a directory of them: harbor:PATH")]
