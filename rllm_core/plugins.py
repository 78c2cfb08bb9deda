"""The plugin manager: loads entry points of group ``rllm`` (built-ins included) and reports what it loaded.

A plugin that fails to import is recorded with its error and skipped, so one broken third-party package
never takes the CLI down; `rllm plugins` shows it. Hooks are called through pluggy (`pm.hook.<name>(...)`),
so pluggy decides the order and runs `wrapper=True` implementations and tracing; an exception in one
implementation is reported and the others still run (see `_IsolatingPluginManager`).
"""

from __future__ import annotations

import difflib
import functools
import logging
import re
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import pluggy

from rllm_core.errors import PluginError
from rllm_core.hookspecs import PROJECT, RLLMHookSpec

__all__ = [
    "PluginInfo",
    "PluginManager",
    "get_plugin_manager",
    "hook_kind",
    "reset_plugin_manager",
]

log = logging.getLogger("rllm.plugins")

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


class _IsolatingPluginManager(pluggy.PluginManager):
    """pluggy's own manager, whose hook implementations cannot raise into a hook call.

    pluggy runs all implementations of a hook in one call and stops at the first exception, so one broken
    plugin would silence every plugin after it. Each implementation is wrapped where pluggy keeps it
    (`HookImpl.function`) as soon as it is registered, by whatever path: calls still go through
    `pm.hook.<name>(...)`, so the order (tryfirst / trylast, last registered first), `wrapper=True`
    implementations, `pm.enable_tracing()` / `pm.trace` and `add_hookcall_monitoring` stay pluggy's own.
    Old-style `hookwrapper=True` implementations are refused: their `Result` protocol would need a second
    isolation path, and pluggy calls them legacy.
    """

    def __init__(self, on_error: Callable[[str, str, Exception], None]) -> None:
        super().__init__(PROJECT)
        self._on_error = on_error

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        plugin_name = super().register(plugin, name)
        if plugin_name is None:
            return None
        impls = [(caller.name, impl) for caller in self.get_hookcallers(plugin) or []
                 for impl in caller.get_hookimpls() if impl.plugin is plugin]
        old_style = sorted(hook for hook, impl in impls if impl.hookwrapper)
        if old_style:
            self.unregister(plugin)
            raise pluggy.PluginValidationError(
                plugin, f"{', '.join(old_style)} uses the old-style @hookimpl(hookwrapper=True), which rllm does "
                        "not run; mark it @hookimpl(wrapper=True) and return the (possibly changed) result")
        for hook_name, impl in impls:
            _isolate(impl, functools.partial(self._on_error, plugin_name, hook_name))
        return plugin_name


class PluginManager:
    """pluggy's manager plus the bookkeeping `rllm plugins` shows."""

    def __init__(self, load_entry_points: bool = True) -> None:
        self.pm = _IsolatingPluginManager(self._plugin_failed)
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
        kinds = sorted({hook_kind(h.name) for h in self.pm.get_hookcallers(plugin) or []})
        self.infos.append(PluginInfo(name, kinds=kinds, version=version, source=source))

    def emit(self, hook_name: str, **kwargs: Any) -> None:
        """Call an event hook (`pm.hook.<name>(**kwargs)`): every plugin's implementation runs, in pluggy's
        order; one plugin's exception is logged and the others still run, so a plugin never breaks a run."""
        self._caller(hook_name)(**kwargs)

    def call_each(self, hook_name: str, **kwargs: Any) -> list[Any]:
        """Call a registration hook (`pm.hook.<name>(**kwargs)`); return the plugins' results in pluggy's call
        order: tryfirst implementations first, then the most recently registered first, trylast ones last.

        A plugin whose hook raises is logged and reported (`rllm plugins` shows it) and left out, so one
        broken plugin never takes the others, or the CLI, down.
        """
        return list(self._caller(hook_name)(**kwargs))

    def _caller(self, hook_name: str) -> Any:
        caller = getattr(self.pm.hook, hook_name, None)
        if caller is None or not caller.has_spec():
            specs = [n for n in dir(RLLMHookSpec) if n.startswith("rllm_")]
            close = difflib.get_close_matches(hook_name, specs, n=1)
            raise PluginError(f"no rllm hook named {hook_name!r}" + (f" (did you mean {close[0]}?)" if close else "")
                              + f"; the hooks are {', '.join(specs)}")
        return caller

    def _plugin_failed(self, plugin_name: str, hook_name: str, exc: Exception) -> None:
        """What an implementation's exception becomes: a log line for events, a reported error otherwise."""
        if hook_kind(hook_name) == "events":
            log.error("rllm plugin %r failed in %s", plugin_name, hook_name, exc_info=exc)
            return
        log.warning("rllm plugin %r failed in %s: %s", plugin_name, hook_name, exc)
        self.report_error(plugin_name, f"{hook_name}: {type(exc).__name__}: {exc}")

    def collect(self, hook_name: str) -> list[Any]:
        """Every plugin's registration list for `hook_name`, concatenated in call order."""
        return [item for result in self.call_each(hook_name) for item in result or []]

    def collect_named(self, hook_name: str) -> dict[str, Any]:
        """The registered specs by their `name`; on a clash the first in call order wins (a tryfirst or
        later-registered plugin overrides a built-in)."""
        found: dict[str, Any] = {}
        for spec in self.collect(hook_name):
            found.setdefault(spec.name, spec)
        return found

    def report_error(self, name: str, error: str) -> None:
        """Attach an error to plugin `name` (shown by `rllm plugins`), e.g. when one of its hooks raised."""
        for info in self.infos:
            if info.name == name:
                info.error = error if info.error is None or error in info.error else f"{info.error}; {error}"
                return
        self.infos.append(PluginInfo(name, error=error))


def hook_kind(hook_name: str) -> str:
    """What `rllm plugins` calls a plugin implementing `hook_name`: `rllm_register_sandbox_providers` →
    "sandbox", `rllm_register_adapters` → "adapter"; every `rllm_on_*` hook → "events". Derived from the name,
    so the manager knows no plugin kinds and a new seam needs no entry here."""
    if hook_name.startswith("rllm_on_"):
        return "events"
    return hook_name.removeprefix("rllm_register_").split("_")[0].removesuffix("s")


def _isolate(impl: pluggy.HookImpl, report: Callable[[Exception], None]) -> None:
    """Make `impl` report its exception instead of raising it into the hook call: a plain implementation
    then returns None (pluggy leaves it out of the results), a wrapper passes the inner result through."""
    function = impl.function
    if impl.wrapper:
        shim: Callable[..., Any] = _isolated_wrapper(function, report)
    else:
        def shim(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except Exception as exc:
                report(exc)
                return None
    impl.function = shim  # type: ignore[misc]  # pluggy reads it at each call; argnames stay the original's


def _isolated_wrapper(function: Callable[..., Any], report: Callable[[Exception], None]) -> Callable[..., Any]:
    """A `wrapper=True` implementation that cannot break the call: one that raises before its yield is left
    out of it, one that raises after it (or yields twice) leaves the inner result as it was."""

    def shim(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
        try:
            teardown = function(*args, **kwargs)
            next(teardown)
        except Exception as exc:  # StopIteration included: a wrapper that never yields
            report(exc)
            return (yield)
        try:
            result = yield
        except BaseException as exc:  # only pluggy's own errors: isolated implementations never raise
            return _resume(teardown, functools.partial(teardown.throw, exc), report, unchanged=exc)
        return _resume(teardown, functools.partial(teardown.send, result), report, unchanged=result)

    return shim


def _resume(teardown: Generator[None, Any, Any], step: Callable[[], Any], report: Callable[[Exception], None],
            unchanged: Any) -> Any:
    """Run a wrapper's part after its yield; what it returns becomes the call's result."""
    try:
        step()
    except StopIteration as stop:
        return stop.value
    except Exception as exc:
        if exc is not unchanged:  # a wrapper that lets the inner error through is not at fault
            report(exc)
    else:
        teardown.close()
        report(RuntimeError("a @hookimpl(wrapper=True) implementation must yield exactly once"))
    if isinstance(unchanged, BaseException):
        raise unchanged
    return unchanged


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
