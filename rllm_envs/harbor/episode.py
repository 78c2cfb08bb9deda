"""One sandboxed Harbor episode: start the task's sandbox, run the agent in it, then the verifier, then close it.

The order is Harbor's: the agent works in the sandbox (its working directory holds the files of `environment/`)
with `current_sandbox()` set and the task's `[agent] timeout_sec`; only after it finishes are `tests/` copied to
`/tests` and `bash /tests/test.sh` run (with `[verifier] timeout_sec`, env and user), so the agent never sees the
tests; the reward is read from `/logs/verifier/reward.txt` (a number) or `reward.json` ({"reward": x, ...}).
Before the verifier runs, `/logs/verifier` and `/tests` are emptied: a reward file or a test the agent planted
must not count (an RL policy finds such shortcuts).

Every way an episode can fail has a reason of its own, never a silent zero (`HarborVerdict.reason`):
`sandbox_error` (the sandbox could not start, or broke), `timeout` (the note says: the agent or the verifier),
`verifier_error` (no reward file, an unreadable reward, the verifier crashed: its output tail is kept),
`harness_error` (a CLI agent run as the agent exited at once: its output tail is kept), else the
reward (`correct` at 1.0 and above, `wrong_answer` below). An agent that RAISES is not caught: the rollout's
episode then ends as `error` with its traceback, like any other agent's (the verifier is not run).
An agent that times out is scored `timeout` without running the verifier: partial work done before the deadline
earns nothing, the same for every attempt.

The sandbox is always closed: on success, failure, timeout and cancellation (Ctrl-C, a run's own timeout).
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rllm_core.harness import HarnessError
from rllm_core.rewards import RewardResult
from rllm_core.sandbox import ExecResult, Sandbox, SandboxError, SandboxProvider, aexec, sandbox_scope
from rllm_core.types import Task
from rllm_envs.harbor.task import HarborTask, HarborTaskError, resolve_env, to_environment_spec
from rllm_rollout.rollout import Rollout, RolloutConfig, _invoke

__all__ = ["HarborEpisode", "HarborVerdict", "VerdictReason", "run_harbor_episode"]

VerdictReason = Literal["correct", "wrong_answer", "timeout", "verifier_error", "sandbox_error", "harness_error"]
_TAIL = 4000
"""Characters of the verifier's output kept in the verdict (the last ones: where a traceback ends)."""
_SETUP_TIMEOUT_S = 60.0
_CLEAN = ("for d in /logs /tests; do { [ -L $d ] || { [ -e $d ] && [ ! -d $d ]; }; } && rm -f $d; mkdir -p $d; "
          "chmod u+rwx $d; done 2>/dev/null; chmod -R u+rwx /logs/verifier /tests 2>/dev/null; "
          "rm -rf /logs/verifier && mkdir -p /logs/verifier && find /tests -mindepth 1 -delete")
"""Run before the verifier: what the agent left in /logs/verifier or /tests must not count, and what it did to
them (`chmod 000 /tests /logs`, /logs replaced by a link or a file) is undone rather than blamed on the sandbox."""
_UPTIME = "read -r up rest < /proc/uptime && echo $up"
"""The sandbox's clock (seconds since its kernel booted) when the agent starts: what started later is the agent's."""
_SWEEP = r"""hz=$(getconf CLK_TCK 2>/dev/null || echo 100); keep=" $$ "; p=$$
while [ "$p" -gt 1 ]; do q=; while read -r k v; do [ "$k" = PPid: ] && q=$v && break; done < /proc/$p/status
  [ -n "$q" ] || break; keep="$keep$q "; p=$q; done
for sig in STOP KILL KILL; do for d in /proc/[0-9]*; do pid=${d#/proc/}
  case "$keep" in *" $pid "*) continue;; esac
  read -r s < "$d/stat" 2>/dev/null || continue; s=${s##*) }; set -- $s
  [ "$2" = "$$" ] && continue
  [ $(( ${20} * 100 / hz )) -gt MARK ] && kill -s $sig "$pid" 2>/dev/null
done; done; true"""
"""Every process that started after the agent did (MARK, in centiseconds of uptime) and is not this command or its
ancestors: a server or watcher the agent left running (remote providers keep them between commands) would
otherwise be running while the verifier works. STOP first, so none can fork away while the rest are killed."""


def sweep_script(mark: str) -> str:
    """The sweep of processes started after `mark` (centiseconds of uptime: a number, or a shell expansion)."""
    return _SWEEP.replace("MARK", mark)


def sweep_command(mark_centis: int | None) -> str:
    """The pre-verifier clean-up, with the sweep of the agent's leftover processes when the start mark is known."""
    return (sweep_script(str(int(mark_centis))) + "\n" if mark_centis is not None else "") + _CLEAN


class HarborVerdict(BaseModel):
    """What the episode's verifier (or its failure) decided; stored as `episode.artifacts["harbor"]`."""

    task_id: str
    reward: float = 0.0
    reason: VerdictReason
    note: str = ""
    """Why, in words: which phase timed out, what the verifier printed last, what the sandbox said."""
    phase: Literal["start", "agent", "verifier", "done"] = "done"
    """Where the episode ended ("done": the verifier ran and its reward was read)."""
    verifier_exit_code: int | None = None
    verifier_output: str = ""
    """The last characters of the verifier's stdout+stderr."""
    rewards: dict[str, Any] = Field(default_factory=dict)
    """reward.json's whole content (Harbor allows several named scores), or {"reward": x} from reward.txt."""
    sandbox_id: str | None = None
    agent_s: float = 0.0
    verifier_s: float = 0.0

    @property
    def is_correct(self) -> bool:
        return self.reason == "correct"

    def to_reward_result(self) -> RewardResult:
        details: dict[str, Any] = {"note": self.note, "phase": self.phase}
        if self.verifier_exit_code is not None:
            details["verifier_exit_code"] = self.verifier_exit_code
        if self.rewards:
            details["rewards"] = self.rewards
        return RewardResult(reward=self.reward if self.reason in ("correct", "wrong_answer") else 0.0,
                            reason=self.reason, is_correct=self.is_correct, details=details)


@dataclass
class HarborEpisode:
    """`run_harbor_episode`'s result: the verdict, and what the agent returned (None when it did not finish)."""

    verdict: HarborVerdict
    agent_output: Any = None


async def run_harbor_episode(
    task: HarborTask,
    agent_rollout: Rollout | Callable[..., Any],
    provider: SandboxProvider,
    *,
    rllm_task: Task | None = None,
    config: RolloutConfig | None = None,
    agent_timeout_s: float | None = None,
    verifier_timeout_s: float | None = None,
) -> HarborEpisode:
    """Run `agent_rollout` on `task` in a sandbox of `provider`, then the task's verifier (module docstring).

    `agent_rollout` is an `@rllm.rollout` (or a plain `(task, config)` function, sync or async); it is called with
    `rllm_task` (default: a Task made from the instruction) and `config` (default: a placeholder for agents that
    make no LLM calls, such as oracle and nop). Timeouts default to the task's own. Exceptions the agent raises
    propagate (after the sandbox is closed)."""
    fn = agent_rollout.fn if isinstance(agent_rollout, Rollout) else agent_rollout
    rllm_task = rllm_task or Task(id=task.id, instruction=task.instruction, metadata={"harbor_dir": str(task.path)})
    config = config or RolloutConfig(base_url="http://127.0.0.1:9/v1", model="none", session_id=uuid.uuid4().hex)
    agent_timeout = agent_timeout_s if agent_timeout_s is not None else task.agent_timeout_s
    verifier_timeout = verifier_timeout_s if verifier_timeout_s is not None else task.verifier_timeout_s
    try:
        spec = to_environment_spec(task)
        sandbox = await _start(provider, spec)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        note = f"sandbox provider {getattr(provider, 'name', provider)!r} could not start task {task.id}: " \
               f"{type(exc).__name__}: {exc}"
        return HarborEpisode(HarborVerdict(task_id=task.id, reason="sandbox_error", phase="start", note=note))
    try:
        mark = await _uptime_mark(sandbox)
        started = time.monotonic()
        agent_output: Any = None
        try:
            with sandbox_scope(sandbox):
                deadline = asyncio.timeout(agent_timeout)
                async with deadline:
                    agent_output = await _invoke(fn, rllm_task, config)
        except TimeoutError:
            if not deadline.expired():
                raise  # the agent's own TimeoutError (an HTTP client's, say): an agent error like any other
            return HarborEpisode(HarborVerdict(
                task_id=task.id, reason="timeout", phase="agent", sandbox_id=sandbox.id,
                agent_s=time.monotonic() - started,
                note=f"agent timed out after {agent_timeout:g} s (task.toml [agent] timeout_sec); "
                     "the verifier was not run"))
        except SandboxError as exc:
            return HarborEpisode(HarborVerdict(
                task_id=task.id, reason="sandbox_error", phase="agent", sandbox_id=sandbox.id,
                agent_s=time.monotonic() - started, note=f"the sandbox failed while the agent ran: {exc}"))
        except HarnessError as exc:  # a CLI agent that could not run: its output tail is the note's end
            return HarborEpisode(HarborVerdict(
                task_id=task.id, reason="harness_error", phase="agent", sandbox_id=sandbox.id,
                agent_s=time.monotonic() - started, note=str(exc), verifier_output=exc.tail[-_TAIL:]))
        agent_s = time.monotonic() - started
        verdict = await _verify(sandbox, task, verifier_timeout, mark)
        verdict.agent_s = agent_s
        return HarborEpisode(verdict, agent_output)
    finally:
        await _close(sandbox)


async def _start(provider: SandboxProvider, spec: Any) -> Sandbox:
    """provider.start on a worker thread; a sandbox that finishes starting after a cancellation is closed."""
    future = asyncio.ensure_future(asyncio.to_thread(provider.start, spec))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_close_late_start)
        raise


def _close_late_start(future: asyncio.Future[Sandbox]) -> None:
    if not future.cancelled() and future.exception() is None:
        _close_quietly(future.result())


async def _close(sandbox: Sandbox) -> None:
    """Close on a worker thread (a Docker close takes a second: the loop keeps serving other episodes); shielded
    so that a cancellation arriving now still lets the close finish."""
    task = asyncio.ensure_future(asyncio.to_thread(_close_quietly, sandbox))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task], timeout=30)  # finish the close even while being cancelled
        raise


def _close_quietly(sandbox: Sandbox) -> None:
    import logging

    try:
        sandbox.close()
    except Exception as exc:  # a failing close must not replace the episode's result
        logging.getLogger("rllm.harbor").warning("closing sandbox %s failed: %s: %s",
                                                 getattr(sandbox, "id", "?"), type(exc).__name__, exc)


async def _uptime_mark(sandbox: Sandbox) -> int | None:
    """The sandbox's uptime in centiseconds, or None where it cannot be read (then no process sweep)."""
    try:
        out = await aexec(sandbox, _UPTIME, timeout_s=_SETUP_TIMEOUT_S)
        return int(float(out.output.strip().split()[0]) * 100) if out.exit_code == 0 else None
    except (SandboxError, ValueError, IndexError):
        return None


async def _verify(sandbox: Sandbox, task: HarborTask, timeout_s: float, mark: int | None = None) -> HarborVerdict:
    base = {"task_id": task.id, "sandbox_id": sandbox.id}
    verifier = task.config.verifier
    try:
        env = resolve_env(verifier.env, f"{task.path / 'task.toml'} [verifier]")
    except HarborTaskError as exc:
        return HarborVerdict(**base, reason="verifier_error", phase="verifier", note=str(exc))
    started = time.monotonic()
    try:
        setup = await aexec(sandbox, sweep_command(mark), timeout_s=_SETUP_TIMEOUT_S)
        if setup.exit_code != 0:
            raise SandboxError(f"preparing /tests and /logs/verifier failed ({setup.exit_code}): "
                               f"{setup.output[-500:]}")
        await asyncio.to_thread(sandbox.upload, task.tests_dir, "/tests")
        env = {"PYTHONNOUSERSITE": "1", **env}  # a site dir the agent planted in a home must not load
        result = await aexec(sandbox, "bash /tests/test.sh", timeout_s=timeout_s, env=env,
                             user=None if verifier.user is None else str(verifier.user), cwd=task.workdir)
    except SandboxError as exc:
        return HarborVerdict(**base, reason="sandbox_error", phase="verifier", verifier_s=time.monotonic() - started,
                             note=f"the sandbox failed while running the verifier: {exc}")
    common = {**base, "verifier_exit_code": result.exit_code, "verifier_output": result.output[-_TAIL:],
              "verifier_s": time.monotonic() - started}
    if result.timed_out:
        return HarborVerdict(**common, reason="timeout", phase="verifier",
                             note=f"verifier (tests/test.sh) timed out after {timeout_s:g} s "
                                  "(task.toml [verifier] timeout_sec)")
    if result.exit_code < 0 or result.exit_code > 128:
        # killed by a signal: a program under test (the agent's) may have written the reward and then killed the
        # verifier before it wrote its own; a reward file from such a run is not trusted
        return HarborVerdict(**common, reason="verifier_error", phase="verifier",
                             note=f"tests/test.sh was killed (exit {result.exit_code}); the reward file, if any, "
                                  f"is ignored; its output ends: {_last_lines(result)}")
    try:
        check = await aexec(sandbox, "[ -d /logs/verifier ] && [ ! -L /logs/verifier ]", timeout_s=_SETUP_TIMEOUT_S)
    except SandboxError as exc:
        return HarborVerdict(**common, reason="sandbox_error", phase="verifier",
                             note=f"the sandbox failed after the verifier ran: {exc}")
    if check.exit_code != 0:
        return HarborVerdict(**common, reason="verifier_error", phase="verifier",
                             note="/logs/verifier is not a plain directory after the verifier ran (a link or a "
                                  "file): the reward is not trusted")
    reward, rewards, problem = await asyncio.to_thread(_read_reward, sandbox)
    if problem is not None:
        return HarborVerdict(**common, reason="verifier_error", phase="verifier",
                             note=f"{problem}; tests/test.sh exited {result.exit_code}; its output ends: "
                                  f"{_last_lines(result)}")
    assert reward is not None
    reason: VerdictReason = "correct" if reward >= 1.0 else "wrong_answer"
    return HarborVerdict(**common, reward=reward, rewards=rewards, reason=reason, note=f"verifier reward {reward:g}")


def _read_reward(sandbox: Sandbox) -> tuple[float | None, dict[str, Any], str | None]:
    """(reward, all scores, None) or (None, {}, what is wrong). reward.txt wins over reward.json, as in Harbor."""
    with tempfile.TemporaryDirectory(prefix="rllm-verifier-") as tmp:
        local = Path(tmp) / "verifier"
        try:
            sandbox.download("/logs/verifier", local)
        except Exception as exc:
            return None, {}, f"no /logs/verifier after the verifier ran ({type(exc).__name__}: {exc})"
        txt, js = local / "reward.txt", local / "reward.json"
        for path in (txt, js):  # a program under test may turn reward.txt into a directory or a link to get
            if path.is_symlink() or (path.exists() and not path.is_file()):  # reward.json read instead: refused
                return None, {}, f"/logs/verifier/{path.name} is not a regular file; the reward is not trusted"
        if txt.is_file():
            text = txt.read_text(encoding="utf-8", errors="replace").strip()
            try:
                value = float(text)
            except ValueError:
                return None, {}, f"/logs/verifier/reward.txt is not a number: {text[:80]!r}"
            if not math.isfinite(value):
                return None, {}, f"/logs/verifier/reward.txt is not a finite number: {text[:80]!r}"
            return value, {"reward": value}, None
        if js.is_file():
            return _json_reward(js.read_text(encoding="utf-8", errors="replace"))
        present = sorted(p.name for p in local.iterdir()) if local.is_dir() else []
        return None, {}, ("the verifier wrote no /logs/verifier/reward.txt or reward.json"
                          + (f" (it holds: {', '.join(present[:10])})" if present else ""))


def _json_reward(text: str) -> tuple[float | None, dict[str, Any], str | None]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, {}, f"/logs/verifier/reward.json is not JSON: {exc}"
    if not isinstance(data, dict):
        return None, {}, f"/logs/verifier/reward.json must be an object like {{\"reward\": 1.0}}, got {text[:80]!r}"
    numbers = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if "reward" in numbers:
        value = float(numbers["reward"])
    elif len(numbers) == 1:
        value = float(next(iter(numbers.values())))
    else:
        return None, data, (f"/logs/verifier/reward.json has no numeric 'reward' (keys: {', '.join(data) or 'none'})")
    if not math.isfinite(value):
        return None, data, f"/logs/verifier/reward.json reward is not finite: {value}"
    return value, data, None


def _last_lines(result: ExecResult, n: int = 8, limit: int = 600) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    text = " | ".join(lines[-n:]) or "(no output)"
    return text[-limit:]
