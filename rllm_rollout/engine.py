"""The rollout engine: run a rollout over tasks × attempts concurrently, score, never let one episode kill a run.

Shared by `rllm eval` and training: training calls it with a benchmark's default rollout, n attempts per task
and the policy server's base_url, and gets Episodes with rewards, reasons and per-role trajectory rewards.

Scoring runs in worker threads (graders may run sandboxed code or sympy), off the event loop. A trajectory
whose metadata carries its own `answer` (solver-judge, self-debate) is graded on that answer, so roles get
their own rewards; other trajectories keep `reward=None` and take the episode's when grouped.

An episode whose conversation outgrew the model's context ends `context_exceeded`, never `error`
(`mark_context_exceeded`): either the agent crashed on the server refusing the prompt as too long (the openai
SDK's BadRequestError with the policy server's, vLLM's, OpenAI's, SGLang's or llama.cpp's message), or the agent
ended the episode itself and said so with `artifacts["context_exceeded_at_turn"]`. Its steps so far are kept;
`artifacts["context_exceeded_at_turn"]` is the 1-based LLM call the server refused.
"""

from __future__ import annotations

import asyncio
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rllm_core.errors import ConfigError
from rllm_core.types import Episode, Task, TerminationReason
from rllm_rollout.rollout import Rollout, as_rollout

if TYPE_CHECKING:
    from rllm_rollout.benchmarks.base import Benchmark
    from rllm_rollout.gateway.client import GatewayClient

__all__ = ["CONTEXT_EXCEEDED", "EngineStats", "context_exceeded_message", "episode_token_counts",
           "is_context_exceeded", "mark_context_exceeded", "run_episodes", "score_episode"]

CONTEXT_EXCEEDED: TerminationReason = "context_exceeded"
"""The termination (and reward) reason of an episode whose prompt no longer fit the model's context."""

_CONTEXT_FULL = re.compile(
    r"context[ _]?(length|window|size)"  # policy server, vLLM 0.x, OpenAI (+ code context_length_exceeded), SGLang,
    r"|max(imum)?[ _]model[ _]len"  # vLLM v1 ("longer than the maximum model length", "max_model_len")
    r"|exceed_context_size|no room in the model|prompt is too long|input prompt .{0,40}too long",
    re.IGNORECASE,
)
"""What servers say when they refuse a prompt (plus max_tokens) that does not fit the model's context: the
policy server "… is over the model's context length of 2048" / "… leaves no room in the model's context";
vLLM "This model's maximum context length is 2048 tokens …" / "… longer than the maximum model length of …";
OpenAI code `context_length_exceeded`; llama.cpp "exceeds the available context size"; Anthropic "prompt is too
long"; litellm's ContextWindowExceededError."""

_REFUSED = re.compile(r"BadRequest|\b(400|413)\b|ContextWindowExceeded|context_length_exceeded", re.IGNORECASE)
"""A client error line that is a 400/413 refusal (only those are context refusals; a 500 mentioning the context
length is a server bug)."""


def is_context_exceeded(message: str | None) -> bool:
    """True when an error message is a server refusing a prompt too long for the model's context."""
    return bool(message) and _CONTEXT_FULL.search(message or "") is not None


def context_exceeded_message(exc: BaseException) -> str | None:
    """The server's message when `exc` is an openai SDK 400/413 refusing a prompt that does not fit the
    context (what agents catch to end an episode cleanly at a full context), else None."""
    status = getattr(exc, "status_code", None)
    if status not in (400, 413):
        return None
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    message = inner.get("message") if isinstance(inner, dict) else None
    text = message if isinstance(message, str) else str(exc)
    code = inner.get("code") if isinstance(inner, dict) else None
    return text if is_context_exceeded(text) or code == "context_length_exceeded" else None


def _refusal_line(error: str, episode: Episode) -> str | None:
    """The exception line of a traceback that is a context refusal, else None. The line itself may say it (the
    openai SDK puts the server's body in it); or, for clients that do not (httpx's raise_for_status), a 400 line
    whose failed call the gateway recorded with the server's body."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines or not _REFUSED.search(lines[-1]):
        return None
    last = lines[-1]
    if is_context_exceeded(last):
        return last[:500]
    failed = [s for s in episode.steps if s.error is not None]
    if failed and is_context_exceeded(failed[-1].error):
        return (failed[-1].error or "")[:500]
    return None


def mark_context_exceeded(episode: Episode) -> bool:
    """Give an episode that ran out of context its own reason instead of `error`; True when it did.

    Two cases: the agent raised on the server's refusal (the traceback's last line is a 400 about the context),
    so the error becomes artifacts `context_exceeded_at_turn` (the refused call: the calls that succeeded + 1) and
    `context_exceeded_message`, and `episode.error` is cleared; or the agent ended cleanly and said so with
    `artifacts["context_exceeded_at_turn"]`. Either way `termination_reason` becomes `context_exceeded`.
    Idempotent; other episodes are left alone."""
    art = episode.artifacts
    if episode.error is None:
        if "context_exceeded_at_turn" in art and episode.termination_reason in (None, "completed"):
            episode.termination_reason = CONTEXT_EXCEEDED
        return "context_exceeded_at_turn" in art and episode.termination_reason == CONTEXT_EXCEEDED
    if episode.termination_reason != "error":
        return False
    line = _refusal_line(episode.error, episode)
    if line is None:
        return False
    art.setdefault("context_exceeded_at_turn", sum(1 for s in episode.steps if s.error is None) + 1)
    art.setdefault("context_exceeded_message", line)
    episode.error = None
    episode.termination_reason = CONTEXT_EXCEEDED
    return True


def episode_token_counts(episode: Episode) -> tuple[int, int]:
    """(prompt tokens, completion tokens) over the episode's steps: token ids when present, else usage."""
    prompt = completion = 0
    for step in episode.steps:
        usage = step.usage or {}
        if step.completion_token_ids is not None:
            completion += len(step.completion_token_ids)
        else:
            completion += int(usage.get("completion_tokens") or 0)
        if step.prompt_token_ids is not None:
            prompt += len(step.prompt_token_ids)
        else:
            prompt += int(usage.get("prompt_tokens") or 0)
    return prompt, completion


@dataclass
class EngineStats:
    """Running totals for the progress bar."""

    done: int = 0
    correct: int = 0
    scored: int = 0
    completion_tokens: int = 0
    started: float = 0.0

    def add(self, ep: Episode) -> None:
        self.done += 1
        if ep.is_correct is not None:
            self.scored += 1
            self.correct += int(ep.is_correct)
        self.completion_tokens += episode_token_counts(ep)[1]

    def line(self) -> str:
        acc = f"acc {self.correct / self.scored:.3f}" if self.scored else "acc -"
        rate = self.completion_tokens / max(time.monotonic() - self.started, 1e-6)
        return f"{acc} · {rate:,.1f} tok/s"


async def score_episode(benchmark: Benchmark, task: Task, episode: Episode) -> Episode:
    """Fill reward, reward_reason, is_correct (and per-role trajectory rewards); never raises. An episode that
    ran out of context is marked first (`mark_context_exceeded`), so the benchmark scores it as such."""
    mark_context_exceeded(episode)
    try:
        result = await asyncio.to_thread(benchmark.score, task, episode)
        episode.reward, episode.reward_reason, episode.is_correct = result.reward, result.reason, result.is_correct
        episode.artifacts["grading"] = {"extracted": result.extracted, "details": result.details}
        for traj in episode.trajectories:
            answer = traj.metadata.get("answer")
            if isinstance(answer, str) and episode.error is None:
                finish = traj.steps[-1].finish_reason if traj.steps else None
                graded = await asyncio.to_thread(benchmark.score_response, task, answer, finish)
                traj.reward = graded.reward
                traj.metadata["reward_reason"] = graded.reason
    except Exception as exc:  # a broken grader scores the episode as an error, the run goes on
        episode.reward, episode.reward_reason, episode.is_correct = 0.0, "error", False
        episode.artifacts["grading"] = {"error": f"{type(exc).__name__}: {exc}"}
    return episode


def _failed_episode(task: Task, attempt: int, rollout: Rollout, exc: BaseException) -> Episode:
    text = "".join(traceback.format_exception(exc))
    return Episode(task=task, attempt=attempt, rollout=rollout.name, termination_reason="error", error=text)


async def run_episodes(
    rollout: Rollout | Callable[..., Any],
    tasks: Sequence[Task],
    *,
    base_url: str | None = None,
    model: str = "default",
    gateway: GatewayClient | None = None,
    attempts: int = 1,
    concurrency: int = 16,
    sampling: dict[str, Any] | None = None,
    benchmark: Benchmark | None = None,
    timeout_s: float | None = None,
    progress: bool = True,
    api_key: str | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    description: str | None = None,
    tokenizer: Any = None,
) -> list[Episode]:
    """Run `rollout` on every task `attempts` times, at most `concurrency` at once; episodes in task order.

    A crashing or timed-out episode is returned with its reason (scored `error` / `timeout` when a benchmark
    is given), never raised. `on_episode` is called as each one finishes (e.g. to append it to a file).
    `gateway` may be a `RemoteGateway` (a gateway in another process); `tokenizer` retokenizes calls to
    upstreams that return no token ids.
    """
    if attempts < 1 or concurrency < 1:
        raise ConfigError(f"attempts and concurrency must be at least 1 (got {attempts}, {concurrency})")
    if base_url is None and gateway is None:
        raise ConfigError("run_episodes needs base_url= (the model endpoint, ending in /v1) or gateway=")
    ro = as_rollout(rollout)
    jobs = [(task, a) for task in tasks for a in range(attempts)]
    results: list[Episode | None] = [None] * len(jobs)
    sem = asyncio.Semaphore(concurrency)
    stats = EngineStats(started=time.monotonic())
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not progress, transient=False)
    bar_id = bar.add_task(description or ro.name, total=len(jobs), stats=stats.line())

    async def one(i: int, task: Task, attempt: int) -> None:
        async with sem:
            try:
                ep = await ro.arun(task, base_url=base_url, model=model, gateway=gateway, api_key=api_key,
                                   timeout_s=timeout_s, attempt=attempt, sampling=sampling,
                                   tokenizer=tokenizer)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ep = _failed_episode(task, attempt, ro, exc)
            mark_context_exceeded(ep)
            if benchmark is not None:
                await score_episode(benchmark, task, ep)
        results[i] = ep
        stats.add(ep)
        bar.update(bar_id, advance=1, stats=stats.line())
        if on_episode is not None:
            on_episode(ep)

    with bar:
        running = [asyncio.create_task(one(i, t, a)) for i, (t, a) in enumerate(jobs)]
        try:
            await asyncio.gather(*running)
        finally:
            for job in running:
                job.cancel()
    return [ep for ep in results if ep is not None]
