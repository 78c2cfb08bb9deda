"""rllm's small core: the vocabulary every other package speaks and the seams plugins fill — nothing else.

What is here: the RL types (Step, Trajectory, Episode, Task), the one error root, the pluggy hook specs and
plugin manager, the episode context, the reward record, the agent/role naming, the sandbox, logger and adapter
seams, and the run directory on disk. Implementations live above it (rllm_rollout, rllm_serve, rllm_envs,
rllm_train, rllm_backends, ...) and the import-linter contracts in pyproject.toml keep every arrow pointing
down to here.

The plugin author's face is `__all__` below (a test pins it): import from `rllm_core` directly. Names resolve
on first use, so importing one submodule (the monitor reads runs without pydantic) loads no other.
"""

from importlib import import_module
from typing import Any

_HOME = {
    # the RL vocabulary
    "Episode": "types", "Step": "types", "Task": "types", "Trajectory": "types", "TrajectoryGroup": "types",
    "RewardResult": "rewards", "agent_name": "roles", "role_of_agent": "roles",
    # errors and warnings: one root each, every message says what to do
    "RLLMError": "errors", "RLLMWarning": "errors", "BenchmarkError": "errors", "CaptureError": "errors",
    "ConfigError": "errors", "PluginError": "errors", "TrainingError": "errors", "UpstreamError": "errors",
    # plugins
    "hookimpl": "hookspecs", "PluginManager": "plugins", "get_plugin_manager": "plugins",
    # the episode a call belongs to
    "agent_scope": "context", "bind_context": "context", "current_episode": "context", "submit": "context",
    # seams
    "AdapterSpec": "adapters", "Logger": "loggers", "LoggerSpec": "loggers",
    "EnvironmentSpec": "sandbox", "ExecResult": "sandbox", "Sandbox": "sandbox", "SandboxError": "sandbox",
    "SandboxProvider": "sandbox", "SandboxProviderSpec": "sandbox", "SandboxResources": "sandbox",
    "aexec": "sandbox", "current_sandbox": "sandbox",
    # episodes and runs on disk
    "read_jsonl": "io", "write_jsonl": "io", "RunReader": "runs", "find_runs": "runs", "open_run": "runs",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'rllm_core' has no attribute {name!r}")
    return getattr(import_module(f"rllm_core.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
