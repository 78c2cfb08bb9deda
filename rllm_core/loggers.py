"""Metric loggers: where a run's metrics go besides its own run directory (TensorBoard, W&B, your plugin).

`metrics.jsonl` is always written by the run directory itself; a logger is an extra copy, so it is a plugin
and can never decide whether the run survives: `open_loggers` gives the training loop a `LoggerGroup` whose
`.log(kind, step, metrics)` fans out to every logger, and a logger that raises is logged once (with its
traceback) and disabled for the rest of the run. Only what the user can fix before the run starts is an
error: an unknown logger name (the message lists the installed ones) or a missing package (it names the
extra to install).

A plugin registers loggers through the hook ``rllm_register_loggers() -> list[LoggerSpec]``::

    @hookimpl
    def rllm_register_loggers():
        return [LoggerSpec("mine", factory=lambda run_dir: MyLogger(run_dir), requires="my-package")]

`factory(run_dir)` returns an object with the `Logger` methods; it may raise ImportError when its package is
missing (the user is told to `pip install <requires>`). Tags: a logger that needs one flat name per series
uses `metric_tag(kind, key)` ("reward/mean" of a train record → "train/reward/mean").
"""

from __future__ import annotations

import difflib
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rllm_core.errors import ConfigError, RLLMError
from rllm_core.plugins import PluginManager, get_plugin_manager

__all__ = ["Logger", "LoggerGroup", "LoggerSpec", "get_loggers", "metric_tag", "open_loggers", "scalar_metrics"]

log = logging.getLogger("rllm.loggers")


@runtime_checkable
class Logger(Protocol):
    """What a logger does; every method is called from the training loop's thread, one call at a time."""

    def log_metrics(self, kind: str, step: int, metrics: Mapping[str, float]) -> None:
        """One record of metrics.jsonl: `kind` is "train", "eval" or "error"; `metrics` holds only finite
        numbers (strings, None and NaN are left out by the group)."""
        ...

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's config (plain JSON data), once, right after the logger is opened."""
        ...

    def close(self) -> None:
        """Flush and release; called once at the end of the run (also when it fails)."""
        ...


@dataclass(frozen=True)
class LoggerSpec:
    """A logger plugin: `factory(run_dir)` returns a `Logger` writing wherever it likes (by convention under
    `run_dir`); `requires` is what to pip install when the factory raises ImportError (e.g. "rllm[wandb]")."""

    name: str
    factory: Callable[[Path], Logger]
    requires: str | None = None
    description: str = ""


def metric_tag(kind: str, key: str) -> str:
    """The flat series name of `key` in a `kind` record: prefixed by the kind so train and eval values land in
    their own groups ("train/reward/mean", "eval/val/reward/accuracy"); a key that already starts with it
    ("train/grad_norm") is not doubled."""
    return key if key.startswith(f"{kind}/") else f"{kind}/{key}"


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record as floats (bools count as 0/1): loggers plot numbers, and a
    record also carries strings ("skipped": reason) and None (a NaN the run directory nulled)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, int | float) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


class LoggerGroup:
    """The open loggers of one run. Every call reaches every logger still enabled; a logger that raises is
    logged once and dropped, so a full disk or a dead W&B service never stops training."""

    def __init__(self, loggers: Mapping[str, Logger] | None = None) -> None:
        self._loggers: dict[str, Logger] = dict(loggers or {})
        self._lock = threading.Lock()
        self._closed = False

    @property
    def names(self) -> list[str]:
        """The loggers still enabled, in the order they were asked for."""
        return list(self._loggers)

    def __len__(self) -> int:
        return len(self._loggers)

    def log(self, kind: str, step: int, metrics: Mapping[str, Any]) -> None:
        """Send one metrics record (the same one metrics.jsonl gets) to every logger."""
        values = scalar_metrics(metrics)
        if values:
            self._each("log_metrics", kind, int(step), values)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._each("log_config", dict(config))

    def close(self) -> None:
        """Close every logger once; later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._each("close")
        self._loggers.clear()

    def __enter__(self) -> LoggerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _each(self, method: str, *args: Any) -> None:
        with self._lock:
            for name, logger in list(self._loggers.items()):
                try:
                    getattr(logger, method)(*args)
                except Exception as exc:
                    self._loggers.pop(name, None)
                    log.warning("logger %r failed in %s and is disabled for the rest of the run (metrics.jsonl "
                                "still has everything): %s: %s", name, method, type(exc).__name__, exc,
                                exc_info=exc)
                    if method != "close":
                        _close_quietly(name, logger)


def open_loggers(names: Sequence[str], run_dir: Path, config: Mapping[str, Any], *,
                 plugins: PluginManager | None = None) -> LoggerGroup:
    """Open the loggers `names` (e.g. ["tensorboard", "wandb"]) for the run in `run_dir` and give each the
    run's `config`. Unknown names and missing packages raise ConfigError before anything is opened; a logger
    whose factory fails otherwise is logged and left out. `plugins`: a PluginManager (default: the process's)."""
    wanted = list(dict.fromkeys(n.strip() for n in names if n and n.strip()))
    if not wanted:
        return LoggerGroup()
    specs = get_loggers(plugins)
    for name in wanted:
        if name not in specs:
            raise ConfigError(_unknown(name, specs))
    if hasattr(config, "model_dump"):  # a TrainConfig given as is
        config = config.model_dump(mode="json")  # type: ignore[union-attr]
    opened: dict[str, Logger] = {}
    try:
        for name in wanted:
            logger = _open_one(specs[name], Path(run_dir))
            if logger is not None:
                opened[name] = logger
    except BaseException:
        LoggerGroup(opened).close()
        raise
    group = LoggerGroup(opened)
    group.log_config(config)
    return group


def _open_one(spec: LoggerSpec, run_dir: Path) -> Logger | None:
    try:
        logger = spec.factory(run_dir)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "a package"
        hint = f'pip install "{spec.requires}"' if spec.requires else f"install {missing}"
        raise ConfigError(f"logger {spec.name!r} needs {missing}, which is not installed: {hint} "
                          f"(or drop --logger {spec.name})") from None
    except RLLMError:
        raise
    except Exception as exc:
        log.warning("logger %r could not start and is left out of this run: %s: %s", spec.name,
                    type(exc).__name__, exc, exc_info=exc)
        return None
    if not isinstance(logger, Logger):
        log.warning("logger %r is left out of this run: its factory returned %s, which lacks log_metrics / "
                    "log_config / close", spec.name, type(logger).__name__)
        return None
    return logger


def _unknown(name: str, specs: Mapping[str, LoggerSpec]) -> str:
    installed = ", ".join(sorted(specs)) or "none"
    close = difflib.get_close_matches(name, list(specs), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"unknown logger {name!r}{hint}; installed loggers: {installed} (metrics.jsonl is always written; "
            "`rllm plugins` lists the plugins)")


def _close_quietly(name: str, logger: Logger) -> None:
    try:
        logger.close()
    except Exception as exc:
        log.debug("logger %r failed to close after its error: %s", name, exc)


def get_loggers(pm: PluginManager | None = None) -> dict[str, LoggerSpec]:
    """Metric loggers by name (`rllm_register_loggers`); on a clash the first in call order wins."""
    return (pm or get_plugin_manager()).collect_named("rllm_register_loggers")
