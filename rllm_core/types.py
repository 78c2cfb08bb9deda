"""The RL vocabulary of rllm: Step, Trajectory, Episode, Task, TrajectoryGroup.

Every other part of rllm speaks these records: capture produces Steps, the rollout engine groups them into
Trajectories and Episodes, rewards fill in Episode/Trajectory rewards, algorithms consume TrajectoryGroups.
They are pydantic v2 models so that a JSONL line round-trips exactly and bad records fail loudly where they
are built, not three stages later inside a loss function.

An Episode always has its Task. Built inside an `@rllm.rollout` function (`return rllm.Episode(artifacts=...)`)
it takes the task, id and attempt of the episode being run when they are not given (`rollout_scope`); built
anywhere else it must be given `task=`, and says so. So `episode.task` is never None wherever it is read.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "Episode",
    "Step",
    "Task",
    "TerminationReason",
    "TokenSource",
    "Trajectory",
    "TrajectoryGroup",
    "group_trajectories",
    "rollout_scope",
]

TokenSource = Literal["server", "retokenized", "none"]
"""Where a Step's token ids came from: the server's own ids, our tokenizer after the fact, or nowhere."""

TerminationReason = Literal[
    "completed", "error", "timeout", "truncated", "max_turns", "env_done", "cancelled", "context_exceeded"
]


def _new_id() -> str:
    return uuid.uuid4().hex


class _Record(BaseModel):
    # NaN / ±Infinity (a -inf logprob, a NaN metric) are written as JSON constants, not null: the round trip stays
    # exact and a record with one never becomes unreadable.
    model_config = ConfigDict(extra="forbid", validate_assignment=False, ser_json_inf_nan="constants")


class Step(_Record):
    """One LLM call (one choice of it when the request asked for n > 1)."""

    id: str = Field(default_factory=_new_id)
    agent: str | None = None
    """The agent / role / graph node that made the call; trajectories are split by it."""
    endpoint: Literal["chat", "completions", "responses", "messages"] = "chat"
    """The API the agent called; a Messages call's `messages` and `params` are kept in their Chat form (what the
    chat template renders), its thinking blocks in `metadata["thinking"]`."""
    model: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    """Sampling parameters as the client sent them (temperature, top_p, max_tokens, tools, ...)."""
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    """Log-probability of each completion token under the distribution it was sampled from."""
    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    latency_s: float | None = None
    started_at: float = Field(default_factory=time.time)
    policy_version: int | None = None
    token_policy_versions: list[int] | None = None
    """The policy version that sampled each completion token, where the server says (rllm's policy server does
    with `return_token_ids`): after a weight swap with `swap_mode="resume"` one completion can span two."""
    token_source: TokenSource = "none"
    choice_index: int = 0
    reward: float | None = None
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_tokens(self) -> Step:
        ids, lps = self.completion_token_ids, self.logprobs
        if ids is not None and lps is not None and len(ids) != len(lps):
            raise ValueError(
                f"Step {self.id}: {len(ids)} completion tokens but {len(lps)} logprobs; "
                "there must be exactly one logprob per completion token"
            )
        if lps is not None and ids is None:
            raise ValueError(f"Step {self.id}: logprobs given without completion_token_ids")
        versions = self.token_policy_versions
        if versions is not None and (ids is None or len(versions) != len(ids)):
            raise ValueError(f"Step {self.id}: {len(versions)} token policy versions for "
                             f"{0 if ids is None else len(ids)} completion tokens; there must be one per token")
        for name, seq in (("prompt_token_ids", self.prompt_token_ids), ("completion_token_ids", ids)):
            if seq and min(seq) < 0:  # caught here, not as an index error inside an embedding lookup
                raise ValueError(f"Step {self.id}: {name} contains a negative id ({min(seq)}); token ids are >= 0")
        if self.token_source != "none" and (self.prompt_token_ids is None or ids is None):
            raise ValueError(
                f"Step {self.id}: token_source={self.token_source!r} needs prompt_token_ids and "
                "completion_token_ids; use token_source='none' for a step without token ids"
            )
        return self

    @property
    def trainable(self) -> bool:
        """True when the step carries everything a trainer needs: ids, logprobs and no error."""
        return (
            self.error is None
            and self.token_source != "none"
            and self.prompt_token_ids is not None
            and self.completion_token_ids is not None
            and self.logprobs is not None
        )


class Trajectory(_Record):
    """One agent's (or role's) ordered steps within an episode."""

    id: str = Field(default_factory=_new_id)
    name: str = "default"
    steps: list[Step] = Field(default_factory=list)
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Task(_Record):
    """One problem to attempt: what the agent is told, and what the reward function checks against."""

    id: str
    instruction: str | list[dict[str, Any]] = ""
    ground_truth: Any = None
    benchmark: str | None = None
    split: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class _RolloutDefaults:
    task: Task
    episode_id: str
    attempt: int


_rollout_defaults: ContextVar[_RolloutDefaults | None] = ContextVar("rllm_rollout_defaults", default=None)


@contextlib.contextmanager
def rollout_scope(task: Task, episode_id: str, attempt: int = 0) -> Iterator[None]:
    """While a rollout function runs: an Episode built without `task` / `id` / `attempt` takes these.

    A context variable, so it follows the agent into its worker thread and its asyncio tasks, and a rollout
    run inside another gets its own."""
    token = _rollout_defaults.set(_RolloutDefaults(task, episode_id, attempt))
    try:
        yield
    finally:
        _rollout_defaults.reset(token)


class Episode(_Record):
    """One attempt at one task: its trajectories, what it produced, and how it was scored."""

    id: str = Field(default_factory=_new_id)
    task: Task
    """Required, except inside an `@rllm.rollout` function, where the rollout's task is the default."""
    trajectories: list[Trajectory] = Field(default_factory=list)
    artifacts: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = None
    reward_reason: str | None = None
    """Why the reward is what it is (correct, wrong_answer, no_answer_extracted, truncated, ...)."""
    is_correct: bool | None = None
    termination_reason: TerminationReason | None = None
    error: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    attempt: int = 0
    rollout: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_from_rollout(cls, data: Any) -> Any:
        """Fill task, id and attempt from the rollout being run; without one, a missing task is an error that
        says what to do (pydantic's own would only say 'task: Field required')."""
        if not isinstance(data, dict) or data.get("task") is not None:
            return data
        scope = _rollout_defaults.get()
        if scope is None:
            raise ValueError("an Episode needs its task: pass Episode(task=...), or build it inside an "
                             "@rllm.rollout function, which fills in the task, id and attempt of the episode it runs")
        return {"id": scope.episode_id, "attempt": scope.attempt, **data, "task": scope.task}

    @property
    def steps(self) -> list[Step]:
        """All steps of all trajectories, in call order."""
        return sorted((s for t in self.trajectories for s in t.steps), key=lambda s: s.started_at)

    def trajectory(self, name: str) -> Trajectory:
        for t in self.trajectories:
            if t.name == name:
                return t
        names = [t.name for t in self.trajectories]
        raise KeyError(f"episode {self.id} has no trajectory named {name!r}; it has {names}")


class TrajectoryGroup(_Record):
    """The same task and role over n attempts: the unit that group-relative advantages are computed on."""

    group_id: str
    task_id: str
    role: str
    trajectories: list[Trajectory] = Field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [t.reward if t.reward is not None else 0.0 for t in self.trajectories]


def group_trajectories(episodes: Iterable[Episode]) -> list[TrajectoryGroup]:
    """Group trajectories by (task id, trajectory name); a trajectory without its own reward takes the episode's."""
    groups: dict[tuple[str, str], TrajectoryGroup] = {}
    for ep in episodes:
        for traj in ep.trajectories:
            if traj.reward is None and ep.reward is not None:
                traj = traj.model_copy(update={"reward": ep.reward})
            key = (ep.task.id, traj.name)
            if key not in groups:
                groups[key] = TrajectoryGroup(
                    group_id=f"{ep.task.id}:{traj.name}", task_id=ep.task.id, role=traj.name
                )
            groups[key].trajectories.append(traj)
    return list(groups.values())
