"""Which store a gateway keeps its Steps in, from a spec string: the memory one or a SQLite file."""

from __future__ import annotations

from rllm_core.errors import ConfigError
from rllm_rollout.gateway.config import StoreLimits
from rllm_rollout.gateway.store import MemoryStore, Store

__all__ = ["open_store"]


def open_store(spec: Store | str | None, limits: StoreLimits | None = None) -> Store:
    """A store from a spec: None or "memory" (in this process), "sqlite:PATH" (a file that survives restarts),
    or a `Store` as is."""
    if spec is None or spec == "memory":
        return MemoryStore(limits)
    if isinstance(spec, str):
        kind, sep, path = spec.partition(":")
        if kind == "sqlite" and sep and path:
            from rllm_rollout.gateway.sqlite_store import SqliteStore  # sqlite3 only when asked for

            return SqliteStore(path, limits)
        raise ConfigError(f"unknown gateway store {spec!r}: use 'memory' or 'sqlite:PATH' (e.g. "
                          "--store sqlite:/tmp/rllm-gateway.db)")
    if not isinstance(spec, Store):
        raise ConfigError(f"store= must be a Store (MemoryStore, SqliteStore) or a spec string, got "
                          f"{type(spec).__name__}")
    return spec
