"""The small subset of a Dockerfile the local provider can honour without building an image.

The local sandbox runs on the host's own (read-only) system, so it can only honour instructions that place files
and set the environment: FROM (noted, not pulled), WORKDIR, COPY (context files), ENV, and metadata (LABEL,
MAINTAINER). Anything that changes the system (RUN apt-get ..., USER, ADD of URLs, multi-stage COPY --from) would
silently give the agent a different machine than the task author meant, so it is refused with a ConfigError that
says to use `--sandbox docker`.
"""

from __future__ import annotations

import glob
import os
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rllm_core.errors import ConfigError

__all__ = ["DockerfilePlan", "parse_dockerfile"]

_IGNORED = {"LABEL", "MAINTAINER"}
_HINT = "run this task with `--sandbox docker` (or another image-building provider)"


@dataclass
class DockerfilePlan:
    """What the Dockerfile asks for: the base image (unused), the final workdir, ENV, and COPYs in order."""

    base_image: str | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[list[Path], str]] = field(default_factory=list)
    """(host sources, absolute destination in the sandbox; ending in '/' means "into this directory")."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash continuations and drop comments/blank lines; keeps the first line number of each."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if not buf:
            start = number
        if line.endswith("\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        out.append((start, " ".join(buf).strip()))
        buf = []
    if buf:
        out.append((start, " ".join(buf).strip()))
    return out


def _parse_env(args: str, where: str) -> dict[str, str]:
    parts = shlex.split(args)
    if not parts:
        raise ConfigError(f"{where}: ENV needs a name and a value")
    if "=" not in parts[0]:  # legacy form: ENV NAME value with spaces
        return {parts[0]: args.split(None, 1)[1].strip() if len(args.split(None, 1)) > 1 else ""}
    env: dict[str, str] = {}
    for part in parts:
        if "=" not in part:
            raise ConfigError(f"{where}: ENV expects NAME=value pairs, got {part!r}")
        name, value = part.split("=", 1)
        env[name] = value
    return env


def parse_dockerfile(path: Path, context: Path, *, default_workdir: str) -> DockerfilePlan:
    """Parse `path` (build context `context`); ConfigError for any instruction the local provider cannot honour."""
    plan = DockerfilePlan()
    workdir = default_workdir
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read Dockerfile {path}: {exc}") from exc
    for number, line in _logical_lines(text):
        where = f"{path}:{number}"
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            plan.base_image = args.split()[0] if args else None
        elif keyword in _IGNORED:
            continue
        elif keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, args.strip("\"'")))
            plan.workdir = workdir
        elif keyword == "ENV":
            plan.env.update(_parse_env(args, where))
        elif keyword == "COPY":
            plan.copies.append(_parse_copy(args, context, workdir, where))
        else:
            raise ConfigError(f"{where}: the local sandbox cannot honour `{keyword}` (it runs on the host's "
                              f"read-only system and only supports FROM, WORKDIR, COPY, ENV); {_HINT}")
    return plan


def _parse_copy(args: str, context: Path, workdir: str, where: str) -> tuple[list[Path], str]:
    if args.startswith("["):
        import json

        try:
            parts = [str(p) for p in json.loads(args)]
        except ValueError as exc:
            raise ConfigError(f"{where}: bad COPY JSON form: {exc}") from exc
    else:
        parts = shlex.split(args)
    flags = [p for p in parts if p.startswith("--")]
    parts = [p for p in parts if not p.startswith("--")]
    for flag in flags:
        if flag.startswith("--from"):
            raise ConfigError(f"{where}: the local sandbox cannot honour COPY {flag} (multi-stage build); {_HINT}")
        # --chown/--chmod: ownership inside the local sandbox is always the sandbox user's; ignored.
    if len(parts) < 2:
        raise ConfigError(f"{where}: COPY needs at least one source and a destination")
    *sources, dest = parts
    dest_abs = posixpath.join(workdir, dest)
    dest_abs = posixpath.normpath(dest_abs) + ("/" if dest.endswith("/") or len(sources) > 1 else "")
    root = context.resolve()
    found: list[Path] = []
    for source in sources:
        matches = sorted(glob.glob(str(root / source))) if any(c in source for c in "*?[") else [str(root / source)]
        for match in matches:
            resolved = Path(os.path.realpath(match))
            if resolved != root and root not in resolved.parents:
                raise ConfigError(f"{where}: COPY source {source!r} is outside the build context {root}")
            if not resolved.exists():
                raise ConfigError(f"{where}: COPY source {source!r} not found in {root}")
            found.append(resolved)
    if not found:
        raise ConfigError(f"{where}: COPY sources {sources} match nothing in {root}")
    return found, dest_abs
