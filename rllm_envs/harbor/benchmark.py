"""`HarborBenchmark`: a directory of Harbor tasks as an rllm benchmark (`rllm eval harbor:PATH`).

Each task becomes a `Task` whose id is its directory name and whose instruction is its instruction.md; the Harbor
directory travels in `metadata["harbor_dir"]` (a path, so tasks pickle to Ray workers). Scoring needs the sandbox,
so it happens inside the episode: `wrap_rollout` turns any agent into one that runs in the task's sandbox and then
runs the verifier (`rllm_envs.harbor.episode`); `score` reads the verdict that rollout stored in
`episode.artifacts["harbor"]`, never the LLM's text.

Subclass it for a task set of your own (the built-in `terminal` set is one): pass the tasks root and a name, and
override `harbor_tasks(split)` to split the tasks differently.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_core.sandbox import SandboxProvider, get_sandbox_provider
from rllm_core.types import Episode, Task, Trajectory
from rllm_envs.harbor.agents import AGENTS, harbor_task_of
from rllm_envs.harbor.episode import HarborVerdict, run_harbor_episode
from rllm_envs.harbor.task import HarborTask, HarborTaskWarning, load_tasks
from rllm_rollout.benchmarks.base import Benchmark, context_exceeded_result
from rllm_rollout.rollout import Rollout, RolloutConfig

__all__ = ["DEFAULT_SANDBOX", "HarborBenchmark"]

DEFAULT_SANDBOX = "local"
_LINTED: set[Path] = set()
_LINT_LOCK = threading.Lock()


def _warn_untrusting_verifiers(tasks: list[HarborTask]) -> None:
    """Warn once per task folder whose verifier lets agent code decide the verdict (verifier_lint.py): the
    folder cannot be rewritten for the user, but a policy trained on it will find the shortcut."""
    import warnings

    from rllm_envs.harbor.verifier_lint import lint_verifier

    with _LINT_LOCK:
        new = [t for t in tasks if t.path not in _LINTED]
        _LINTED.update(t.path for t in new)
    flagged = [(t, w) for t in new for w in lint_verifier(t.path)[:1]]
    for task, warning in flagged[:3]:
        warnings.warn(f"verifier of {task.id} may trust agent code: {warning}", HarborTaskWarning, stacklevel=3)
    if len(flagged) > 3:
        warnings.warn(f"{len(flagged) - 3} more verifiers may trust agent code (rllm_envs.harbor.verifier_lint)",
                      HarborTaskWarning, stacklevel=3)


class HarborBenchmark(Benchmark):
    """The Harbor tasks under `path` (one task directory, or a directory of them)."""

    category = "agent"
    reward = "verifier"
    splits: tuple[str, ...] = ("test",)
    default_sandbox: str = DEFAULT_SANDBOX

    def __init__(self, path: str | os.PathLike[str], name: str | None = None, description: str | None = None,
                 agent: Rollout | Callable[[], Rollout] | None = None) -> None:
        self.path = Path(path).expanduser()
        self._agent = agent
        self.name = name or f"harbor:{path}"
        self.description = description or f"Harbor tasks in {self.path}, verified in a sandbox"
        self.source = f"Harbor task directories ({self.path})"

    # ---------------------------------------------------------------------------------------------- tasks
    def harbor_tasks(self, split: str = "test") -> list[HarborTask]:
        """The Harbor tasks of `split` (here: every task, for every split), sorted by id."""
        self._check_split(split)
        return load_tasks(self.path)

    def rows(self, split: str = "test") -> int | None:
        try:
            return len(self.harbor_tasks(split))
        except Exception:
            return None  # `rllm bench list` must not fail on one broken task set: load() says what is wrong

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        """The tasks (`data_dir`, when given, is another Harbor directory to load instead)."""
        found = load_tasks(data_dir) if data_dir else self.harbor_tasks(split)
        _warn_untrusting_verifiers(found)
        tasks = [self.to_task(h, split) for h in found]
        return tasks[:max_examples] if max_examples is not None else tasks

    def to_task(self, htask: HarborTask, split: str = "test") -> Task:
        meta = htask.metadata
        return Task(id=htask.id, instruction=htask.instruction, benchmark=self.name, split=split,
                    metadata={"harbor_dir": str(htask.path), "workdir": htask.workdir,
                              "agent_timeout_s": htask.agent_timeout_s,
                              **{k: meta[k] for k in ("difficulty", "category", "tags") if k in meta}})

    # ---------------------------------------------------------------------------------------------- agents
    def default_rollout(self) -> Rollout:
        """The agent run without --agent: the one this benchmark was built with (`harbor:PATH` names get the
        built-in terminal agent, rllm_envs.terminal); a Rollout, or a function giving one on first use (so loading
        a task set does not import the agent's client)."""
        if self._agent is None:
            raise BenchmarkError(f"{self.name} has no default agent: pass --agent (a rollout), or `oracle` / `nop`")
        if not isinstance(self._agent, Rollout):
            self._agent = self._agent()
        return self._agent

    def named_agent(self, name: str) -> Rollout | None:
        """`oracle` (the task's solution/solve.sh) and `nop` (does nothing); None for any other name."""
        return AGENTS.get(name)

    def wrap_rollout(self, rollout: Rollout, *, sandbox: str | SandboxProvider | None = None) -> Rollout:
        """`rollout` run as a sandboxed episode: sandbox started from the task's environment, the agent inside it
        (`current_sandbox()`), then the verifier; the sandbox is always closed. `sandbox` is a provider name
        (default "local"; checked now, so an unknown one fails before the first episode) or a provider object."""
        if getattr(rollout, "harbor_wrapped", False):
            return rollout
        ref: str | SandboxProvider = sandbox if sandbox is not None else self.default_sandbox
        if isinstance(ref, str):
            _provider(ref)
        wrapped = Rollout(functools.partial(_sandboxed_episode, rollout, ref), name=rollout.name)
        wrapped.harbor_wrapped = True  # type: ignore[attr-defined]
        return wrapped

    # ---------------------------------------------------------------------------------------------- scoring
    def grade(self, task: Task, response: str) -> RewardResult:
        return RewardResult.fail("error", note="Harbor tasks are scored by their verifier in the sandbox, not from "
                                 "a response text; run the agent through HarborBenchmark.wrap_rollout")

    def score(self, task: Task, episode: Episode) -> RewardResult:
        """The verifier's verdict (a crashed or cancelled agent: `error`, as for any benchmark)."""
        verdict = episode.artifacts.get("harbor")
        if verdict is None or episode.error is not None:
            base = super().score(task, episode)
            if verdict is None and base.reason not in ("error", "timeout"):
                return RewardResult.fail("error", note="no verifier result in the episode: the rollout was not run "
                                         "through HarborBenchmark.wrap_rollout (the sandbox and verifier)")
            return base
        try:
            result = HarborVerdict.model_validate(verdict).to_reward_result()
        except ValidationError as exc:
            return RewardResult.fail("error", note=f"unreadable verifier verdict: {exc}")
        return context_exceeded_result(episode, result)  # a task left undone by an agent out of context


# -------------------------------------------------------------------------------------------------- the episode
_providers: dict[str, SandboxProvider] = {}
_providers_lock = threading.Lock()


def _provider(ref: str | SandboxProvider) -> SandboxProvider:
    """A provider object as is; a name built once per process (providers may hold clients, pools)."""
    if not isinstance(ref, str):
        return ref
    with _providers_lock:
        if ref not in _providers:
            _providers[ref] = get_sandbox_provider(ref)
        return _providers[ref]


async def _sandboxed_episode(agent: Rollout, ref: str | SandboxProvider, task: Task, config: RolloutConfig) -> Any:
    """The wrapped rollout's function: the agent's return value with the verdict added as artifacts["harbor"]."""
    outcome = await run_harbor_episode(harbor_task_of(task), agent, _provider(ref), rllm_task=task, config=config)
    verdict = outcome.verdict.model_dump(mode="json")
    result = outcome.agent_output
    if isinstance(result, Episode):
        result.artifacts["harbor"] = verdict
        return result
    if isinstance(result, Trajectory):
        try:  # inside a rollout the episode takes its task and id from the rollout
            return Episode(trajectories=[result], artifacts={"harbor": verdict})
        except ValidationError:
            return Episode(task=task, trajectories=[result], artifacts={"harbor": verdict})
    if isinstance(result, dict):
        return {**result, "harbor": verdict}
    if isinstance(result, str):
        return {"answer": result, "harbor": verdict}
    if result is None:
        return {"harbor": verdict}
    return {"result": repr(result), "harbor": verdict}
