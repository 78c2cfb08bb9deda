"""What an eval run reports: accuracy, pass@k (unbiased estimator), mean reward, reasons, tokens, time.

`reasons` counts each reward reason (correct, wrong_answer, truncated, context_exceeded, error, ...) and
`terminations` how the episodes ended (completed, error, timeout, context_exceeded, ...); an episode that ran out
of context is neither an error nor counted in `errors`, and `context_exceeded` says how many did.

pass@k uses the unbiased estimator of Chen et al. (2021): with n attempts of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks; reported for k = 1, 2, 4, ... up to the attempts.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rllm_core.types import Episode
from rllm_rollout.engine import episode_token_counts

__all__ = ["EvalSummary", "RoleSummary", "first_error_line", "pass_at_k", "print_summary", "summarize",
           "summarize_roles"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: n attempts, c correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts per task, got {n}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c, k) / C(n, k) as a stable product
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def _ks(n: int) -> list[int]:
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if n not in ks:
        ks.append(n)
    return ks


class RoleSummary(BaseModel):
    trajectories: int
    mean_reward: float
    reasons: dict[str, int] = Field(default_factory=dict)


def summarize_roles(episodes: Sequence[Episode]) -> dict[str, RoleSummary]:
    """Trajectories that carry their own reward, by role name; empty for single-agent rollouts."""
    rewards: dict[str, list[float]] = defaultdict(list)
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for ep in episodes:
        for traj in ep.trajectories:
            if traj.reward is not None:
                rewards[traj.name].append(traj.reward)
                reasons[traj.name][str(traj.metadata.get("reward_reason", "unscored"))] += 1
    return {role: RoleSummary(trajectories=len(vals), mean_reward=sum(vals) / len(vals),
                              reasons=dict(reasons[role].most_common())) for role, vals in sorted(rewards.items())}


class EvalSummary(BaseModel):
    benchmark: str
    split: str
    model: str
    base_url: str | None = None
    n_tasks: int
    n_episodes: int
    attempts: int
    accuracy: float
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    mean_reward: float
    reasons: dict[str, int] = Field(default_factory=dict)
    terminations: dict[str, int] = Field(default_factory=dict)
    """How many episodes ended each way (`Episode.termination_reason`: completed, error, timeout, ...)."""
    context_exceeded: int = 0
    """Episodes that ended because their prompt no longer fit the model's context (`rllm_rollout.engine`)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_s: float = 0.0
    wall_time_s: float = 0.0
    errors: int = 0
    first_error: str | None = None
    """The last line of the first failed episode's error (its exception), so a run that failed says why."""
    grader_means: dict[str, float] = Field(default_factory=dict)
    """The mean of each score the grader reported beside the reward (`artifacts["grading"]["details"]["scores"]`:
    a benchmark's EM and F1, supporting-passage recall, ...) over the episodes that report it."""
    tool_calls_per_episode: float | None = None
    """Environment tool calls per episode (`artifacts["tool_log"]`), for agents that record them."""
    roles: dict[str, RoleSummary] = Field(default_factory=dict)
    """Per-role results of workflows whose roles are graded on their own answers (solver, judge, debater)."""
    config: dict[str, Any] = Field(default_factory=dict)


def first_error_line(episodes: Sequence[Episode]) -> str | None:
    """The exception line of the first episode that failed: a traceback's last non-empty line."""
    for ep in episodes:
        if ep.error:
            lines = [line.strip() for line in ep.error.strip().splitlines() if line.strip()]
            return lines[-1][:500] if lines else None
    return None


def grader_means(episodes: Sequence[Episode]) -> dict[str, float]:
    values: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        grading = ep.artifacts.get("grading")
        details = grading.get("details") if isinstance(grading, dict) else None
        scores = details.get("scores") if isinstance(details, dict) else None
        for key, value in (scores if isinstance(scores, dict) else {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[key].append(float(value))
    return {k: sum(v) / len(v) for k, v in sorted(values.items())}


def summarize(episodes: Sequence[Episode], *, benchmark: str, split: str, model: str, attempts: int,
              wall_time_s: float, base_url: str | None = None, config: dict[str, Any] | None = None) -> EvalSummary:
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        by_task[ep.task.id].append(ep)
    n_eps = len(episodes)
    correct = sum(1 for e in episodes if e.is_correct)
    passk: dict[str, float] = {}
    min_n = min((len(v) for v in by_task.values()), default=0)
    for k in _ks(min_n):
        vals = [pass_at_k(len(v), sum(1 for e in v if e.is_correct), k) for v in by_task.values()]
        passk[f"pass@{k}"] = sum(vals) / len(vals)
    prompt = completion = 0
    for ep in episodes:
        p, c = episode_token_counts(ep)
        prompt, completion = prompt + p, completion + c
    reasons = Counter(e.reward_reason or "unscored" for e in episodes)
    terminations = Counter(e.termination_reason or "unknown" for e in episodes)
    context_full = sum(1 for e in episodes if "context_exceeded_at_turn" in e.artifacts)
    logged = [e for e in episodes if isinstance(e.artifacts.get("tool_log"), list)]
    return EvalSummary(
        benchmark=benchmark, split=split, model=model, base_url=base_url, n_tasks=len(by_task), n_episodes=n_eps,
        attempts=attempts, accuracy=correct / n_eps if n_eps else 0.0, pass_at_k=passk,
        mean_reward=sum(e.reward or 0.0 for e in episodes) / n_eps if n_eps else 0.0,
        reasons=dict(reasons.most_common()), terminations=dict(terminations.most_common()),
        context_exceeded=context_full, prompt_tokens=prompt, completion_tokens=completion,
        tokens_per_s=completion / wall_time_s if wall_time_s > 0 else 0.0, wall_time_s=wall_time_s,
        errors=sum(1 for e in episodes if e.error is not None), first_error=first_error_line(episodes),
        roles=summarize_roles(episodes), grader_means=grader_means(episodes),
        tool_calls_per_episode=(sum(len(e.artifacts["tool_log"]) for e in logged) / len(logged)) if logged else None,
        config=dict(config or {}),
    )


def print_summary(summary: EvalSummary, console: Console | None = None) -> None:
    table = Table(title=f"{summary.benchmark} ({summary.split}) · {summary.model}", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("tasks × attempts", f"{summary.n_tasks} × {summary.attempts}")
    table.add_row("accuracy", f"{summary.accuracy:.3f}")
    for k, v in summary.pass_at_k.items():
        table.add_row(k, f"{v:.3f}")
    table.add_row("mean reward", f"{summary.mean_reward:.3f}")
    table.add_row("reasons", ", ".join(f"{r} {n}" for r, n in summary.reasons.items()))
    for key, value in summary.grader_means.items():
        table.add_row(f"mean {key}", f"{value:.3f}")
    if summary.tool_calls_per_episode is not None:
        table.add_row("tool calls / episode", f"{summary.tool_calls_per_episode:.2f}")
    if summary.context_exceeded:
        table.add_row("context exceeded", f"{summary.context_exceeded} of {summary.n_episodes} episodes")
    for role, rs in summary.roles.items():
        table.add_row(f"role {role} (×{rs.trajectories})", f"mean reward {rs.mean_reward:.3f}")
    table.add_row("tokens (prompt / completion)", f"{summary.prompt_tokens:,} / {summary.completion_tokens:,}")
    table.add_row("completion tok/s", f"{summary.tokens_per_s:,.1f}")
    table.add_row("wall time", f"{summary.wall_time_s:.1f} s")
    console = console or Console()
    console.print(table)
    if summary.errors and summary.first_error:
        console.print(f"[red]{summary.errors} of {summary.n_episodes} episodes failed; first error: "
                      f"{escape(summary.first_error)}[/red]", highlight=False, soft_wrap=True)
