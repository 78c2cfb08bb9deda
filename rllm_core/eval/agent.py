"""`--agent my_pkg.agents:solve`: import the user's rollout, and say exactly what is wrong when it fails."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from rllm_core.errors import ConfigError
from rllm_core.rollout import Rollout

__all__ = ["load_agent"]


def _refuse_file_path(spec: str, module_name: str, attr: str) -> None:
    """A file path where a module name belongs (`agents.py:solve`, `./agents:solve`) is a common slip: say
    which module name to give instead of passing on importlib's confusing message."""
    if not (module_name.endswith(".py") or "/" in module_name or "\\" in module_name):
        return
    dotted = module_name.removesuffix(".py").lstrip("./").replace("/", ".").replace("\\", ".")
    raise ConfigError(f"--agent {spec!r}: give a module name, not a file path: --agent {dotted}:{attr} "
                      "(run from the folder that holds it)")


def load_agent(spec: str) -> Rollout:
    """Import `module.path:function` (the current directory is importable) and return it as a Rollout."""
    if ":" not in spec:
        raise ConfigError(f"--agent {spec!r} must look like 'package.module:function' (a colon before the name)")
    module_name, _, attr = spec.partition(":")
    _refuse_file_path(spec, module_name, attr)
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`, so a module next to the user imports
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--agent {spec!r}: module {module_name!r} could not be imported ({exc})") from exc
    except Exception as exc:
        raise ConfigError(
            f"--agent {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            raise ConfigError(f"--agent {spec!r}: {module_name!r} has no attribute {attr!r}; it has {names[:20]}")
        obj = getattr(obj, part)
    if isinstance(obj, Rollout):
        return obj
    kind = type(obj).__name__
    if callable(obj):
        raise ConfigError(
            f"--agent {spec!r} is a plain {kind}, not a rollout: decorate it with @rllm.rollout "
            "(it receives (task, config) and sends its LLM calls to config.base_url)"
        )
    raise ConfigError(f"--agent {spec!r} is a {kind} ({obj!r}), not an @rllm.rollout function")
