"""The benchmark registry: every plugin's `rllm_register_benchmarks` hook, collected and checked once.

Benchmarks are checked when collected (a name, a load and a grade method, no duplicate names), not when a
run first touches them. An unknown name gets the closest registered names (difflib) in its error.
"""

from __future__ import annotations

import difflib
import logging
import threading

from rllm_core.benchmarks.base import Benchmark
from rllm_core.errors import BenchmarkError, PluginError
from rllm_core.plugins import PluginManager, get_plugin_manager

__all__ = ["get_benchmark", "list_benchmarks", "reset_benchmarks"]

log = logging.getLogger("rllm.benchmarks")
_cache: tuple[object, dict[str, Benchmark]] | None = None
"""(the plugin manager it was collected from, name → benchmark): a reset manager means a fresh collection."""
_lock = threading.Lock()


def _check(bench: object) -> Benchmark:
    for attr in ("name", "category", "reward", "load", "grade", "score", "score_response", "default_rollout"):
        if not hasattr(bench, attr):
            raise PluginError(
                f"registered benchmark {bench!r} has no {attr!r}; subclass rllm_core.benchmarks.Benchmark"
            )
    return bench  # type: ignore[return-value]


def _collect(pm: PluginManager) -> dict[str, Benchmark]:
    found: dict[str, Benchmark] = {}
    for bench in pm.benchmarks():
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


_PREFIXES: dict[str, str] = {"harbor": "rllm_envs.harbor.plugin:harbor_benchmark"}
"""`PREFIX:ARG` names (e.g. `harbor:./tasks`) built on demand by `module:factory(ARG)`: task sets on disk."""


def _from_prefix(prefix: str, arg: str) -> Benchmark:
    import importlib

    module, _, attr = _PREFIXES[prefix].partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise BenchmarkError(f"{prefix}:PATH benchmarks need {module} ({exc}); reinstall rllm") from exc
    return _check(factory(arg))


def get_benchmark(name: str) -> Benchmark:
    """The benchmark called `name` (or built from a `harbor:PATH` name); BenchmarkError with the closest names
    when there is none."""
    reg = _registry()
    if name in reg:
        return reg[name]
    prefix, sep, arg = name.partition(":")
    if sep and prefix in _PREFIXES:
        return _from_prefix(prefix, arg)
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
