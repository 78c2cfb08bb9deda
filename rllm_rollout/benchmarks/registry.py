"""The benchmark registry: every plugin's `rllm_register_benchmarks` hook, collected and checked once, and
the benchmark sources (`rllm_register_benchmark_sources`) that build `PREFIX:ARG` names on demand.

Benchmarks are checked when collected (a name, a load and a grade method, no duplicate names), not when a
run first touches them. An unknown name gets the closest registered names (difflib) in its error.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rllm_core.errors import BenchmarkError, PluginError
from rllm_core.plugins import PluginManager, get_plugin_manager
from rllm_rollout.benchmarks.base import Benchmark

__all__ = ["BenchmarkSourceSpec", "get_benchmark", "get_benchmark_sources", "list_benchmarks", "reset_benchmarks"]

log = logging.getLogger("rllm.benchmarks")
_cache: tuple[object, dict[str, Benchmark]] | None = None
"""(the plugin manager it was collected from, name → benchmark): a reset manager means a fresh collection."""
_lock = threading.Lock()


def _check(bench: object) -> Benchmark:
    for attr in ("name", "category", "reward", "load", "grade", "score", "score_response", "default_rollout"):
        if not hasattr(bench, attr):
            raise PluginError(
                f"registered benchmark {bench!r} has no {attr!r}; subclass rllm_rollout.benchmarks.base.Benchmark"
            )
    return bench  # type: ignore[return-value]


def _collect(pm: PluginManager) -> dict[str, Benchmark]:
    found: dict[str, Benchmark] = {}
    for bench in pm.collect("rllm_register_benchmarks"):
        bench = _check(bench)
        if bench.name in found:
            log.warning("benchmark %r registered twice; keeping the first (%r)", bench.name, found[bench.name])
            continue
        found[bench.name] = bench
    return found


def _registry() -> dict[str, Benchmark]:
    global _cache
    pm = get_plugin_manager()
    with _lock:
        if _cache is None or _cache[0] is not pm:
            _cache = (pm, _collect(pm))
        return _cache[1]


def list_benchmarks() -> list[Benchmark]:
    """Every registered benchmark, sorted by (category, name)."""
    return sorted(_registry().values(), key=lambda b: (b.category, b.name))


@dataclass(frozen=True)
class BenchmarkSourceSpec:
    """Benchmarks built on demand from a `PREFIX:ARG` name (`harbor:./tasks`): `factory(ARG)` → a Benchmark."""

    prefix: str
    factory: Callable[[str], Benchmark]
    description: str = ""

    @property
    def name(self) -> str:
        return self.prefix


def get_benchmark_sources(pm: PluginManager | None = None) -> dict[str, BenchmarkSourceSpec]:
    """Benchmark sources by prefix (`rllm_register_benchmark_sources`); the first in call order wins a clash."""
    return (pm or get_plugin_manager()).collect_named("rllm_register_benchmark_sources")


def get_benchmark(name: str) -> Benchmark:
    """The benchmark called `name` (or built from a `harbor:PATH` name); BenchmarkError with the closest names
    when there is none."""
    reg = _registry()
    if name in reg:
        return reg[name]
    prefix, sep, arg = name.partition(":")
    if sep and (source := get_benchmark_sources().get(prefix)) is not None:
        return _check(source.factory(arg))
    lowered = {n.lower().replace("-", "_"): n for n in reg}
    key = name.lower().replace("-", "_")
    if key in lowered:
        return reg[lowered[key]]
    close = difflib.get_close_matches(name, list(reg), n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise BenchmarkError(f"unknown benchmark {name!r}.{hint} Run `rllm bench list` to see all {len(reg)}.")


def reset_benchmarks() -> None:
    """Forget the collected registry (after registering a plugin in the same process, or in tests)."""
    global _cache
    with _lock:
        _cache = None
