"""The shape of the code: a small core that names no implementation, and a pinned face for plugin authors.

The import arrows themselves are checked by `lint-imports` (pyproject.toml's contracts, run in CI); these
tests pin what import-linter cannot see: strings that name a module, the core's size, and its public face.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import rllm_core

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "rllm_core"
PACKAGES = sorted((p.name for p in ROOT.glob("rllm*") if (p / "__init__.py").is_file()), key=len, reverse=True)
IMPLEMENTATIONS = re.compile(r"\brllm_(rollout|train|serve|envs|backends|adapters|sandboxes|loggers|monitor|testing)\b")


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings (what an importlib call or entry point would use)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    docstrings |= {id(node.value) for node in ast.walk(tree)  # attribute docstrings: a string right after
                   if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_core_names_no_implementation_package_in_code() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}: {text!r}" for p in sorted(CORE.rglob("*.py"))
             for line, text in _code_strings(p) if IMPLEMENTATIONS.search(text)]
    assert found == []


def test_the_core_stays_small() -> None:
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in CORE.rglob("*.py"))
    assert lines <= 3000, f"rllm_core has {lines} lines: vocabulary and seams only (implementations go above it)"


def test_the_plugin_authors_face_is_pinned() -> None:
    assert rllm_core.__all__ == [
        "AdapterSpec", "BenchmarkError", "CaptureError", "ConfigError", "EnvironmentSpec", "Episode", "ExecResult",
        "Logger", "LoggerSpec", "PluginError", "PluginManager", "RLLMError", "RLLMWarning", "RewardResult", "RunReader",
        "Sandbox", "SandboxError", "SandboxProvider", "SandboxProviderSpec", "SandboxResources", "Step", "Task",
        "TrainingError", "Trajectory", "TrajectoryGroup", "UpstreamError", "aexec", "agent_name", "agent_scope",
        "bind_context", "current_episode", "current_sandbox", "find_runs", "get_plugin_manager", "hookimpl",
        "open_run", "read_jsonl", "role_of_agent", "submit", "write_jsonl",
    ]
    for name in rllm_core.__all__:
        assert getattr(rllm_core, name) is not None, name


def test_importing_one_core_module_loads_no_other_package() -> None:
    """The monitor reads runs without pydantic or torch: the core's face loads lazily, and nothing in the core
    pulls an implementation package in."""
    code = ("import sys, rllm_core.runs.reader; "
            "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(('rllm', 'pydantic', 'torch'))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['rllm_core']"


def test_docs_and_examples_name_only_modules_that_exist() -> None:
    """Old deep import paths are not kept as shims, so a doc naming one would send a reader to nothing."""
    import importlib.util

    dotted_name = re.compile(rf"\b((?:{'|'.join(PACKAGES)})(?:\.[a-z_][a-z0-9_]*)+)")
    named = set()
    for path in [*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("examples/**/*.py")]:
        named |= set(dotted_name.findall(path.read_text(encoding="utf-8")))
    missing = []
    for dotted in sorted(named):
        parts = dotted.split(".")
        # the longest importable prefix must exist; the rest may be attributes (functions, classes)
        for i in range(len(parts), 0, -1):
            try:
                if importlib.util.find_spec(".".join(parts[:i])) is not None:
                    break
            except ModuleNotFoundError:  # a prefix is a module, not a package: a shorter prefix decides
                continue
        else:
            missing.append(dotted)
        if i == 1 and len(parts) > 1 and not hasattr(importlib.import_module(parts[0]), parts[1]):
            missing.append(dotted)  # only the top package exists, and it has no such name: the path is gone
    assert missing == []


def test_tensor_shape_suffixes_use_the_axis_letters_defined_once() -> None:
    from rllm_core.shapes import AXES

    suffix = re.compile(r"(?<![\\])\b[a-z][a-z0-9]*_([A-Z]{1,4})\b")  # not `\n_CODE` in generated source
    not_shapes = {"lora_A", "lora_B", "step_N", "get_X"}  # PEFT's weight names, a path pattern, prose
    unknown = set()
    for path in [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]:
        for m in suffix.finditer(path.read_text(encoding="utf-8")):
            if m.group(0) not in not_shapes and not set(m.group(1)) <= set(AXES):
                unknown.add(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert unknown == set()


def test_no_module_imports_itself_back() -> None:
    """No import cycle anywhere (lazy imports included; `if TYPE_CHECKING:` ones are not executed): a module
    that needs another's caller has its concept in the wrong room. import-linter's layers keep the packages
    apart; this keeps every module inside them apart too."""
    import grimp

    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, exclude_type_checking_imports=True)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            parent_child = imported.startswith(module + ".") or module.startswith(imported + ".")
            if not parent_child and graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} -> {imported}")
    assert cycles == []


def test_every_public_name_of_every_module_resolves() -> None:
    """Faces that resolve names lazily (PEP 562) or re-export them must name what exists after a move."""
    import importlib
    import pkgutil

    broken = []
    for top in PACKAGES:
        package = importlib.import_module(top)
        modules = [top, *(info.name for info in pkgutil.walk_packages(package.__path__, f"{top}."))]
        for name in modules:
            if ".tasks." in name or name.endswith(".__main__"):
                continue  # the terminal tasks' own programs; the CLI entry
            module = importlib.import_module(name)
            for attr in getattr(module, "__all__", ()):
                try:
                    getattr(module, attr)
                except (AttributeError, ImportError) as exc:
                    broken.append(f"{name}.{attr}: {exc}")
    assert broken == []
