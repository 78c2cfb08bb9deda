"""`--agent my_pkg.agents:solve` or `--agent path/to/agents.py:solve`: import the user's rollout, and say exactly
what is wrong when it fails.

A file is loaded the way `python path/to/agents.py` would see it: its folder goes first on `sys.path` (so the
file's own `import helpers` of a sibling module works), and it runs as a module of its own under a name made
from its resolved path (`_rllm_agent_agents_<hash>`), registered in `sys.modules` (LangGraph, pydantic and
typing resolve a class's annotations through it). Loading the same file again returns the module already
loaded, like a second `import`.

A worker process (`--rollout-workers`, Ray) cannot import that made-up module name, so a rollout loaded from a
file pickles as "load `/absolute/path/file.py:function` again": each worker runs the file itself, at the same path.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from rllm_core.errors import ConfigError
from rllm_rollout.rollout import Rollout

__all__ = ["load_agent"]


def _is_path(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or "\\" in module_part


def _split(spec: str) -> tuple[str, str]:
    """(module or file, attribute); the last colon splits, so a Windows path's drive colon stays in the path."""
    if ":" not in spec:
        raise ConfigError(f"--agent {spec!r} must look like 'package.module:function' or 'path/to/file.py:function' "
                          "(a colon before the name)")
    module_part, _, attr = spec.rpartition(":")
    if not module_part or not attr:
        raise ConfigError(f"--agent {spec!r} must look like 'package.module:function' or "
                          "'path/to/file.py:function' (a name on both sides of the colon)")
    return module_part, attr


def _file_module_name(path: Path) -> str:
    """A module name no other module has: the file's stem plus a hash of its resolved path."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"_rllm_agent_{stem}_{digest}"


def _load_file(spec: str, module_part: str) -> ModuleType:
    """Run `module_part` (a .py file) as a fresh module, or return the one already loaded from that file."""
    path = Path(module_part).expanduser().resolve()
    attr = spec.rpartition(":")[2]
    if path.is_dir():
        raise ConfigError(f"--agent {spec!r}: {path} is a folder: name the .py file in it "
                          f"(--agent {module_part.rstrip('/')}/FILE.py:{attr})")
    if path.suffix != ".py":
        dotted = module_part.lstrip("./").replace("/", ".").replace("\\", ".")
        raise ConfigError(f"--agent {spec!r}: a file path must name the .py file (--agent {module_part}.py:{attr}), "
                          f"or give a module name (--agent {dotted}:{attr})")
    if not path.is_file():
        raise ConfigError(f"--agent {spec!r}: {path} does not exist")
    name = _file_module_name(path)
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # as `python file.py` does: the file's sibling modules import
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"--agent {spec!r}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before running it: dataclasses, pydantic and typing look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, ImportError):
            raise ConfigError(f"--agent {spec!r}: {path} could not be imported ({exc})") from exc
        if isinstance(exc, Exception):
            raise ConfigError(f"--agent {spec!r}: running {path} raised {type(exc).__name__}: {exc}") from exc
        raise
    return module


_BY_PATH: dict[type, type] = {}
"""Rollout class -> its subclass that pickles by file path (made once per class, so a RoleRollout stays one)."""


def _reduce_by_path(self: Rollout) -> tuple[object, tuple[str]]:
    return load_agent, (self.__dict__["_rllm_agent_spec"],)


def _by_path(rollout: Rollout, path: Path, attr: str) -> Rollout:
    """`rollout` (of any Rollout class) as an object that pickles as `load_agent("<absolute path>:<attr>")`."""
    cls = type(rollout)
    sub = _BY_PATH.get(cls)
    if sub is None:
        sub = _BY_PATH[cls] = type(cls.__name__, (cls,), {"__reduce__": _reduce_by_path,
                                                          "__module__": cls.__module__})
    twin: Rollout = object.__new__(sub)
    twin.__dict__.update(rollout.__dict__)
    twin.__dict__["_rllm_agent_spec"] = f"{path}:{attr}"
    return twin


def _import_module(spec: str, module_name: str) -> ModuleType:
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`, so a module next to the user imports
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--agent {spec!r}: module {module_name!r} could not be imported ({exc})") from exc
    except Exception as exc:
        raise ConfigError(
            f"--agent {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def load_agent(spec: str) -> Rollout:
    """Import `package.module:function` (the current directory is importable) or load `path/to/file.py:function`
    (relative to the current directory), and return that attribute as a Rollout."""
    module_part, attr = _split(spec)
    from_file = _is_path(module_part)
    module = _load_file(spec, module_part) if from_file else _import_module(spec, module_part)
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            raise ConfigError(f"--agent {spec!r}: {module_part!r} has no attribute {attr!r}; it has {names[:20]}")
        obj = getattr(obj, part)
    if isinstance(obj, Rollout):
        return _by_path(obj, Path(str(module.__file__)), attr) if from_file else obj
    kind = type(obj).__name__
    if callable(obj):
        raise ConfigError(
            f"--agent {spec!r} is a plain {kind}, not a rollout: decorate it with @rllm.rollout "
            "(it receives (task, config) and sends its LLM calls to config.base_url)"
        )
    raise ConfigError(f"--agent {spec!r} is a {kind} ({obj!r}), not an @rllm.rollout function")
