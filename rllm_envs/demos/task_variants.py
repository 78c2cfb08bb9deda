"""Variants of Harbor tasks for demonstrations: the same task with its files and folders under /app renamed.

Twenty-two terminal references teach a small model the form of a solution (a `bash` call, then done) but also
teach it to write the same paths whatever it is asked; a renamed copy of a task (`/app/people.csv` →
`/app/contacts.csv`, `/app/logs` → `/app/events`) keeps the skill and changes the names, so a demonstration has to
read them from the instruction. Every top-level name under `/app` that the instruction mentions is renamed in
every text file of the task (instruction, Dockerfile `COPY` lines, environment files, solve.sh, verifier) and in
the environment folder; nothing else changes. A rename the reference does not survive (a script that `cd /app`s
and uses a bare name) makes a variant whose reference fails its verifier, and `rllm sft --min-reward 1` keeps it
out: the verifier, not this module, says which variants are valid.

Only train tasks should be given (`rllm demos` refuses held-out splits): a variant of a held-out task would leak it.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from rllm_core.errors import ConfigError

__all__ = ["NAMES", "app_names", "write_variants"]

NAMES = ("records", "entries", "contacts", "ledger", "events", "inventory", "catalog", "archive", "metrics", "batch",
         "journal", "results", "samples", "notes", "queue", "history", "roster", "backlog", "digest", "registry",
         "payload", "parcel", "export", "intake", "outbox", "staging", "snapshot", "tally", "manifest", "dataset")
"""Stems a renamed file or folder takes (its extension kept): plain words an instruction could use."""

_APP_NAME = re.compile(r"/app/([A-Za-z0-9_][A-Za-z0-9_.-]*[A-Za-z0-9_])")
_NAME_END = r"(?![A-Za-z0-9_.-]*[A-Za-z0-9_])"


def app_names(instruction: str) -> list[str]:
    """The top-level names under /app the instruction mentions (`/app/people.csv`, `/app/logs/old` → `logs`)."""
    return sorted(set(_APP_NAME.findall(instruction)))


def _renamed(name: str, stem: str) -> str:
    """`name` with `stem` before its extension(s): people.csv → contacts.csv, logs.tar.gz → events.tar.gz."""
    dot = name.find(".", 1)
    return stem + (name[dot:] if dot > 0 else "")


def _rewrite(text: str, mapping: dict[str, str]) -> str:
    """`/app/OLD` → `/app/NEW` for each name (never a longer name that starts with it), and `COPY OLD ` lines."""
    for old, new in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(r"/app/" + re.escape(old) + _NAME_END, "/app/" + new, text)
        text = re.sub(r"^(COPY\s+)" + re.escape(old) + r"(\s)", r"\g<1>" + new + r"\g<2>", text, flags=re.MULTILINE)
    return text


def _variant(src: Path, dest: Path, mapping: dict[str, str]) -> None:
    shutil.copytree(src, dest, symlinks=True)
    for old, new in mapping.items():
        moved = dest / "environment" / old
        if moved.exists() and not moved.is_symlink():
            moved.rename(dest / "environment" / new)
    for path in sorted(dest.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # binary (a git bundle, an archive): its bytes stay
            continue
        changed = _rewrite(text, mapping)
        if changed != text:
            path.write_text(changed)


def write_variants(task_dirs: Sequence[Path], out_dir: Path, per_task: int, seed: int = 0) -> list[Path]:
    """`per_task` renamed copies of each Harbor task directory, written under `out_dir` as `<id>-v<k>` (with a
    `variant.json`: the source task and the names it changed); the new task directories. A task whose
    instruction names nothing under /app gets none."""
    if per_task < 1:
        raise ConfigError(f"--task-variants must be at least 1, got {per_task}")
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    written: list[Path] = []
    for src in task_dirs:
        names = app_names((src / "instruction.md").read_text())
        if not names:
            continue
        taken = {n.split(".", 1)[0] for n in names}
        for k in range(1, per_task + 1):
            stems = rng.sample([s for s in NAMES if s not in taken], len(names))
            mapping = {name: _renamed(name, stem) for name, stem in zip(names, stems, strict=True)}
            dest = out_dir / f"{src.name}-v{k}"
            if dest.exists():
                shutil.rmtree(dest)
            _variant(src, dest, mapping)
            (dest / "variant.json").write_text(json.dumps({"variant_of": src.name, "renamed": mapping}, indent=1))
            written.append(dest)
    return written
