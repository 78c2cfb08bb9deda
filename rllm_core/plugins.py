"""The plugin manager: loads entry points of group ``rllm`` (built-ins included) and reports what it loaded.

A plugin that fails to import is recorded with its error and skipped, so one broken third-party package
never takes the CLI down; `rllm plugins` shows it.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import pluggy

from rllm_core.errors import PluginError
from rllm_core.hookspecs import PROJECT, RLLMHookSpec

__all__ = [
    "AdapterSpec",
    "BackendSpec",
    "PluginInfo",
    "PluginManager",
    "get_plugin_manager",
    "reset_plugin_manager",
]

log = logging.getLogger("rllm.plugins")

_KIND_BY_HOOK = {
    "rllm_register_adapters": "adapter",
    "rllm_register_backends": "backend",
    "rllm_register_benchmarks": "benchmark",
    "rllm_register_commands": "command",
    "rllm_on_llm_call": "events",
    "rllm_on_episode_end": "events",
}


@dataclass(frozen=True)
class AdapterSpec:
    """An agent-framework adapter: where it lives, which extra installs it, which versions were tested."""

    name: str
    module: str
    framework: str
    extra: str | None = None
    tested_versions: str | None = None
    description: str = ""


@dataclass(frozen=True)
class BackendSpec:
    """A training backend: `factory(config)` returns an object implementing the Backend protocol."""

    name: str
    factory: Callable[..., Any]
    description: str = ""
    requires: str | None = None


@dataclass
class PluginInfo:
    name: str
    kinds: list[str] = field(default_factory=list)
    version: str | None = None
    source: str = ""
    error: str | None = None

    @property
    def kind(self) -> str:
        return ",".join(self.kinds) if self.kinds else "-"


class PluginManager:
    """pluggy's manager plus the bookkeeping `rllm plugins` shows."""

    def __init__(self, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(RLLMHookSpec)
        self.infos: list[PluginInfo] = []
        if load_entry_points:
            self.load_entry_points()

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def load_entry_points(self) -> None:
        for ep in sorted(entry_points(group=PROJECT), key=lambda e: e.name):
            version = ep.dist.version if ep.dist is not None else None
            if self.pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin is reported, never fatal
                log.warning("rllm plugin %r failed to load: %s", ep.name, exc)
                self.infos.append(
                    PluginInfo(ep.name, version=version, source=ep.value, error=f"{type(exc).__name__}: {exc}")
                )
                continue
            try:
                self.register(plugin, name=ep.name, version=version, source=ep.value)
            except PluginError as exc:  # hooks that do not match the specs: reported and skipped, like an import error
                log.warning("rllm plugin %r skipped: %s", ep.name, exc)
                self.infos.append(PluginInfo(ep.name, version=version, source=ep.value, error=str(exc)))

    def register(self, plugin: Any, name: str, version: str | None = None, source: str = "") -> None:
        """Register `plugin` (module or object with hookimpls); checked against the specs right here."""
        if self.pm.has_plugin(name) or self.pm.is_registered(plugin):
            raise PluginError(f"a plugin named {name!r} (or this same object) is already registered; "
                              "give the second one another name or unregister the first")
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except (ValueError, pluggy.PluginValidationError) as exc:
            if self.pm.has_plugin(name):
                self.pm.unregister(name=name)
            raise PluginError(f"plugin {name!r} does not match rllm's hook specs: {_mismatch(exc)}") from exc
        kinds = sorted({_KIND_BY_HOOK[h.name] for h in self.pm.get_hookcallers(plugin) or []})
        self.infos.append(PluginInfo(name, kinds=kinds, version=version, source=source))

    def emit(self, hook_name: str, **kwargs: Any) -> None:
        """Call an event hook on every plugin; one plugin's exception is logged, never raised into a run."""
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            try:
                _call(impl, kwargs)
            except Exception:
                log.exception("rllm plugin %r failed in %s", impl.plugin_name, hook_name)

    def call_each(self, hook_name: str, **kwargs: Any) -> list[Any]:
        """Call a registration hook on each plugin separately, in registration order (entry points by name, then
        plugins registered by hand); return the results.

        A plugin whose hook raises is logged and reported (`rllm plugins` shows it) and left out, so one
        broken plugin never takes the others, or the CLI, down.
        """
        results = []
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            try:
                results.append(_call(impl, kwargs))
            except Exception as exc:
                log.warning("rllm plugin %r failed in %s: %s", impl.plugin_name, hook_name, exc)
                self.report_error(impl.plugin_name, f"{hook_name}: {type(exc).__name__}: {exc}")
        return results

    def _collect(self, hook_name: str) -> list[Any]:
        """Concatenate every plugin's registration list."""
        return [item for result in self.call_each(hook_name) for item in result or []]

    def report_error(self, name: str, error: str) -> None:
        """Attach an error to plugin `name` (shown by `rllm plugins`), e.g. when one of its hooks raised."""
        for info in self.infos:
            if info.name == name:
                info.error = error if info.error is None or error in info.error else f"{info.error}; {error}"
                return
        self.infos.append(PluginInfo(name, error=error))

    def adapters(self) -> list[AdapterSpec]:
        return self._collect("rllm_register_adapters")

    def backends(self) -> dict[str, BackendSpec]:
        return {b.name: b for b in self._collect("rllm_register_backends")}

    def benchmarks(self) -> list[Any]:
        return self._collect("rllm_register_benchmarks")


def _call(impl: pluggy.HookImpl, kwargs: dict[str, Any]) -> Any:
    """Call one hook implementation with the arguments it declares (pluggy lets it take fewer than the spec)."""
    return impl.function(**{name: kwargs[name] for name in impl.argnames})


_manager: PluginManager | None = None
_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, loaded on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager


def reset_plugin_manager() -> None:
    """Forget the loaded plugins (tests, or after installing a plugin in the same process)."""
    global _manager
    with _lock:
        _manager = None


def _mismatch(exc: Exception) -> str:
    """pluggy's validation error as one line a plugin author can act on: a misspelt hook gets the closest real
    hook name (pluggy names only the bad one, followed by the module's repr), a wrong signature loses the
    line breaks that would break the `rllm plugins` table."""
    text = " ".join(str(exc).split())
    unknown = re.match(r"unknown hook '(\w+)'", text)
    if unknown is None:
        return text
    specs = [n for n in dir(RLLMHookSpec) if n.startswith("rllm_")]
    close = difflib.get_close_matches(unknown.group(1), specs, n=1)
    return f"unknown hook {unknown.group(1)!r}" + (f" (did you mean {close[0]}?)" if close else "")
