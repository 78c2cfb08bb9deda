"""The two agents every Harbor task set is validated with: `oracle` (the task's own solution) and `nop` (nothing).

A correct task scores 1.0 with the oracle and 0.0 with nop: the oracle shows the verifier accepts a real solution,
nop shows it does not accept the untouched start state. Both run inside a sandboxed episode (they use
`current_sandbox()`), and make no LLM call.

Only the oracle gets `solution/`: it uploads it itself, to `/solution` (Harbor's path), and runs
`bash /solution/solve.sh` in the working directory with `[solution] env`. A provider that cannot write /solution
(its writable roots are the workdir, /tests, /logs, /tmp) gets it at /tmp/solution instead; a solve.sh that names
its own files by the absolute /solution path then fails there, which the returned `solution_path` shows.
"""

from __future__ import annotations

import asyncio
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from rllm_core.sandbox import SandboxError, aexec, current_sandbox
from rllm_core.types import Task
from rllm_envs.harbor.task import HarborTask, HarborTaskError, load_task, resolve_env
from rllm_rollout.rollout import RolloutConfig, rollout

__all__ = ["AGENTS", "harbor_task_of", "nop", "oracle"]

log = logging.getLogger("rllm.harbor")
_TAIL = 2000


@lru_cache(maxsize=4096)
def _load_cached(path: str) -> HarborTask:
    return load_task(path)


def harbor_task_of(task: Task) -> HarborTask:
    """The Harbor task an rllm Task was made from (its `metadata["harbor_dir"]`), loaded once per process."""
    path = task.metadata.get("harbor_dir")
    if not isinstance(path, str):
        raise HarborTaskError(f"task {task.id} is not a Harbor task (it has no metadata['harbor_dir']); load it "
                              "through harbor:PATH or HarborBenchmark")
    return _load_cached(str(Path(path).resolve()))


@rollout(name="oracle")
async def oracle(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """Run the task's solution/solve.sh in the sandbox; the verifier then scores the result."""
    htask = harbor_task_of(task)
    if htask.solution_dir is None:
        raise HarborTaskError(f"{htask.path / 'solution' / 'solve.sh'}: missing; the oracle agent runs the task's "
                              "own solution, so every task validated with --agent oracle needs one")
    sandbox = current_sandbox()
    where = "/solution"
    try:
        await asyncio.to_thread(sandbox.upload, htask.solution_dir, where)
    except SandboxError as exc:
        log.debug("task %s: %s; the solution goes to /tmp/solution", htask.id, exc)
        where = "/tmp/solution"
        await asyncio.to_thread(sandbox.upload, htask.solution_dir, where)
    env = resolve_env(htask.config.solution.env, f"{htask.path / 'task.toml'} [solution]")
    result = await aexec(sandbox, f"bash {where}/solve.sh", timeout_s=htask.agent_timeout_s, env=env,
                         cwd=htask.workdir)
    return {"answer": "", "solution_path": where, "solve_exit_code": result.exit_code,
            "solve_output": result.output[-_TAIL:], "solve_timed_out": result.timed_out}


@rollout(name="nop")
def nop(task: Task, config: RolloutConfig) -> dict[str, Any]:
    """Do nothing: the verifier sees the task's start state (which must score 0)."""
    return {"answer": ""}


AGENTS = {"oracle": oracle, "nop": nop}
"""The agents `HarborBenchmark.named_agent` knows by name."""
