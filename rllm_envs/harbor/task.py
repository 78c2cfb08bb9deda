"""Harbor task directories (the format of Terminal-Bench 2 and rLLM): load, check, and turn into a sandbox spec.

A task is a directory whose name is its id:

    my-task/
    ├── task.toml          [metadata], [environment], [agent], [verifier], [solution] (Harbor's field names)
    ├── instruction.md     what the agent is told
    ├── environment/       Dockerfile + the files placed in the working directory (optional here)
    ├── tests/test.sh      the verifier: writes /logs/verifier/reward.txt (a number) or reward.json
    └── solution/solve.sh  the oracle (optional)

Field names and defaults follow Harbor's `TaskConfig` (schema 1.x). Keys this loader does not know are WARNED
about, not refused: Harbor itself ignores unknown keys and its schema keeps growing, so refusing would reject task
sets that Harbor runs; the warning still catches a misspelt `timout_sec`. A malformed task (no task.toml, no
tests/test.sh, bad TOML, a value of the wrong type) is a `HarborTaskError` naming the file.

Network: Harbor's `allow_internet` defaults to true, but a sandbox here gets network only when the task asks for
it explicitly (`allow_internet = true` or `network_mode = "public"`/"allowlist"): an RL agent should not reach the
internet by accident, and the local (bubblewrap) provider cannot give network at all.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rllm_core.errors import BenchmarkError, RLLMWarning
from rllm_core.sandbox import DEFAULT_WORKDIR, EnvironmentSpec, SandboxResources

__all__ = ["DEFAULT_AGENT_TIMEOUT_S", "HarborAgentConfig", "HarborEnvironmentConfig", "HarborTask",
           "HarborTaskConfig", "HarborTaskError", "HarborTaskWarning", "HarborVerifierConfig", "load_task",
           "load_tasks", "resolve_env", "to_environment_spec"]

DEFAULT_AGENT_TIMEOUT_S = 600.0
"""The agent's time when `[agent] timeout_sec` is unset (Harbor leaves it to the job; we need a number)."""


class HarborTaskError(BenchmarkError):
    """A task directory that is not a valid Harbor task; the message names the file and what is wrong."""


class HarborTaskWarning(RLLMWarning):
    """Something in a task that is ignored (an unknown key, a feature no provider here implements)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class HarborEnvironmentConfig(_Section):
    """`[environment]`: the sandbox the agent works in."""

    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    cpus: float = 1
    memory_mb: int = 2048
    storage_mb: int = 10240
    gpus: int = 0
    gpu_types: list[str] | None = None
    allow_internet: bool = True
    network_mode: str | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """Host environment variables for the sandbox; `${VAR}` and `${VAR:-default}` are resolved at start."""
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    skills_dir: str | None = None
    healthcheck: dict[str, Any] | None = None
    memory: str | None = None
    """Deprecated Harbor spelling ('2G', '512M'): read into memory_mb."""
    storage: str | None = None
    """Deprecated Harbor spelling: read into storage_mb."""

    @model_validator(mode="after")
    def _sizes(self) -> HarborEnvironmentConfig:
        if self.memory is not None:
            self.memory_mb, self.memory = _size_mb(self.memory, "memory"), None
        if self.storage is not None:
            self.storage_mb, self.storage = _size_mb(self.storage, "storage"), None
        if self.cpus <= 0 or self.memory_mb <= 0 or self.storage_mb <= 0:
            raise ValueError("cpus, memory_mb and storage_mb must be positive")
        if self.network_mode not in (None, "public", "no-network", "allowlist"):
            raise ValueError(f"network_mode must be 'public', 'no-network' or 'allowlist', got {self.network_mode!r}")
        return self


class HarborAgentConfig(_Section):
    """`[agent]`."""

    timeout_sec: float | None = None
    user: str | int | None = None
    network_mode: str | None = None
    allowed_hosts: list[str] = Field(default_factory=list)


class HarborVerifierConfig(_Section):
    """`[verifier]`: how tests/test.sh runs."""

    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    network_mode: str | None = None
    allowed_hosts: list[str] = Field(default_factory=list)


class HarborSolutionConfig(_Section):
    """`[solution]`: environment variables of the oracle's solve.sh."""

    env: dict[str, str] = Field(default_factory=dict)


class HarborTaskConfig(_Section):
    """One task.toml."""

    schema_version: str = Field("1.0", alias="version")
    task: dict[str, Any] | None = None
    """Harbor's `[task]` package section (name, description, authors, keywords), kept as is."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    environment: HarborEnvironmentConfig = Field(default_factory=HarborEnvironmentConfig)
    agent: HarborAgentConfig = Field(default_factory=HarborAgentConfig)
    verifier: HarborVerifierConfig = Field(default_factory=HarborVerifierConfig)
    solution: HarborSolutionConfig = Field(default_factory=HarborSolutionConfig)
    source: str | None = None

    @field_validator("schema_version", mode="before")
    @classmethod
    def _version_text(cls, v: Any) -> str:
        return str(v)


_SECTIONS: dict[str, type[BaseModel] | None] = {
    "environment": HarborEnvironmentConfig, "agent": HarborAgentConfig, "verifier": HarborVerifierConfig,
    "solution": HarborSolutionConfig, "metadata": None, "task": None,
}
_TOP_KEYS = {"version", "schema_version", "source", *_SECTIONS}


class HarborTask(BaseModel):
    """A loaded task: its files, its config, and what the episode needs (timeouts, workdir, network)."""

    model_config = ConfigDict(frozen=True)

    id: str
    """The directory name."""
    path: Path
    instruction: str
    config: HarborTaskConfig
    workdir: str = DEFAULT_WORKDIR
    """The Dockerfile's last absolute WORKDIR, else /app (Terminal-Bench's convention)."""
    environment_dir: Path | None = None
    dockerfile: Path | None = None
    tests_dir: Path
    solution_dir: Path | None = None
    """Set when solution/solve.sh exists."""
    network: bool = False
    """True only when task.toml asks for network explicitly (see the module docstring)."""
    unknown_keys: tuple[str, ...] = ()

    @property
    def agent_timeout_s(self) -> float:
        return self.config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S

    @property
    def verifier_timeout_s(self) -> float:
        return self.config.verifier.timeout_sec

    @property
    def has_solution(self) -> bool:
        return self.solution_dir is not None

    @property
    def metadata(self) -> dict[str, Any]:
        return self.config.metadata


def load_task(path: str | os.PathLike[str]) -> HarborTask:
    """Load one task directory; HarborTaskError naming the file for anything malformed."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise HarborTaskError(f"{root}: not a directory (a Harbor task is a directory with task.toml, "
                              "instruction.md and tests/test.sh)")
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise HarborTaskError(f"{toml_path}: missing; every Harbor task needs a task.toml "
                              "(it may be as small as `[verifier]\\ntimeout_sec = 120`)")
    try:
        raw = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise HarborTaskError(f"{toml_path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise HarborTaskError(f"{toml_path}: not UTF-8 text ({exc})") from None
    if "steps" in raw:
        raise HarborTaskError(f"{toml_path}: multi-step tasks ([[steps]]) are not supported; give the task one "
                              "instruction.md and one tests/test.sh")
    unknown = _unknown_keys(raw)
    if unknown:
        warnings.warn(f"{toml_path}: unknown keys ignored: {', '.join(unknown)} (Harbor's keys: [environment] "
                      "cpus/memory_mb/storage_mb/docker_image/..., [agent] timeout_sec, [verifier] timeout_sec/env)",
                      HarborTaskWarning, stacklevel=2)
    try:
        config = HarborTaskConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise HarborTaskError(f"{toml_path}: {problems}") from None
    for name in ("mcp_servers", "healthcheck", "skills_dir"):
        if getattr(config.environment, name):
            warnings.warn(f"{toml_path}: [environment] {name} is not supported here and is ignored",
                          HarborTaskWarning, stacklevel=2)
    instruction_path = root / "instruction.md"
    if not instruction_path.is_file():
        raise HarborTaskError(f"{instruction_path}: missing; it holds what the agent is told to do")
    instruction = instruction_path.read_text(encoding="utf-8").strip()
    if not instruction:
        raise HarborTaskError(f"{instruction_path}: empty; it must say what the agent is told to do")
    tests_dir = root / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise HarborTaskError(f"{tests_dir / 'test.sh'}: missing; it is the verifier, run as `bash /tests/test.sh` "
                              "after the agent, and writes its reward to /logs/verifier/reward.txt")
    env_dir = root / "environment"
    dockerfile = env_dir / "Dockerfile"
    solution = root / "solution"
    return HarborTask(
        id=root.name, path=root, instruction=instruction, config=config,
        workdir=_dockerfile_workdir(dockerfile) if dockerfile.is_file() else DEFAULT_WORKDIR,
        environment_dir=env_dir if env_dir.is_dir() else None,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        tests_dir=tests_dir, solution_dir=solution if (solution / "solve.sh").is_file() else None,
        network=_wants_network(raw.get("environment", {})), unknown_keys=tuple(unknown),
    )


def load_tasks(path: str | os.PathLike[str]) -> list[HarborTask]:
    """One task directory, or a directory of them (every non-hidden subdirectory is a task), sorted by id.

    All malformed tasks are reported together, so fixing a task set takes one run, not one per task."""
    root = Path(path).expanduser()
    if not root.exists():
        raise HarborTaskError(f"{root}: no such directory (harbor:PATH takes a task directory or a directory "
                              "of task directories)")
    if (root / "task.toml").is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise HarborTaskError(f"{root}: not a directory")
    subdirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))
    if not subdirs:
        raise HarborTaskError(f"{root}: no tasks here: expected task.toml, or subdirectories that each hold one")
    tasks: list[HarborTask] = []
    errors: list[str] = []
    for sub in subdirs:
        try:
            tasks.append(load_task(sub))
        except HarborTaskError as exc:
            errors.append(str(exc))
    if errors:
        shown = "\n  ".join(errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise HarborTaskError(f"{len(errors)} of {len(subdirs)} tasks in {root} are malformed:\n  {shown}{more}")
    return tasks


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env(env: dict[str, str], where: str) -> dict[str, str]:
    """Harbor's `${VAR}` / `${VAR:-default}` templates resolved from this process's environment; a variable
    that is unset and has no default is an error naming it (a task that needs a key should not run without)."""
    out: dict[str, str] = {}
    for key, value in env.items():
        def sub(m: re.Match[str], key: str = key) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise HarborTaskError(f"{where}: env {key} needs ${{{name}}}, which is not set here")
        out[key] = _VAR.sub(sub, str(value))
    return out


def to_environment_spec(task: HarborTask) -> EnvironmentSpec:
    """The sandbox spec of `task`: image or Dockerfile, workdir, resources, network, env."""
    env = task.config.environment
    resources = SandboxResources(cpus=float(env.cpus), memory_mb=env.memory_mb, disk_mb=env.storage_mb,
                                 timeout_s=task.agent_timeout_s)
    return EnvironmentSpec(name=task.id, environment_dir=task.environment_dir, dockerfile=task.dockerfile,
                           image=env.docker_image, workdir=task.workdir, resources=resources, network=task.network,
                           env=resolve_env(env.env, f"{task.path / 'task.toml'} [environment]"),
                           hidden=(task.path.resolve(), task.path.resolve().parent))  # its answers, its set's


# ---------------------------------------------------------------------------------------------- helpers
def _unknown_keys(raw: dict[str, Any]) -> list[str]:
    unknown = [k for k in raw if k not in _TOP_KEYS]
    for name, model in _SECTIONS.items():
        section = raw.get(name)
        if model is None or not isinstance(section, dict):
            continue
        known = set(model.model_fields)
        unknown += [f"[{name}] {k}" for k in section if k not in known]
    return unknown


def _wants_network(environment: Any) -> bool:
    if not isinstance(environment, dict):
        return False
    if environment.get("network_mode") in ("public", "allowlist") or environment.get("allowed_hosts"):
        return True
    return environment.get("allow_internet") is True


def _size_mb(text: str, name: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMG])B?\s*", str(text).upper())
    if not m or not math.isfinite(float(m.group(1))):
        raise ValueError(f"{name} = {text!r}: expected a size like '2G' or '512M' (or use {name}_mb)")
    value, unit = float(m.group(1)), m.group(2)
    return int(value * 1024) if unit == "G" else int(value) if unit == "M" else max(1, int(value / 1024))


def _dockerfile_workdir(dockerfile: Path) -> str:
    """The working directory the Dockerfile leaves (its WORKDIRs applied in order), else /app."""
    workdir: str | None = None
    try:
        lines = dockerfile.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return DEFAULT_WORKDIR
    for line in lines:
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].upper() == "WORKDIR":
            value = parts[1].strip().strip("\"'")
            if value.startswith("/"):
                workdir = value
            elif workdir is not None and "$" not in value:
                workdir = f"{workdir.rstrip('/')}/{value}"
    if workdir is None:
        return DEFAULT_WORKDIR
    return workdir.rstrip("/") or "/"
