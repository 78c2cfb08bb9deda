"""Where `rllm sft` rows come from, packed exactly as RL rows are (`rllm_train.packing.pack_trajectory`).

- **A run's episodes** (a run directory of `rllm train` or `rllm eval`, or one episodes `.jsonl`), kept by an
  `EpisodeFilter` (reward, reason, benchmark, role, a Python predicate): their Steps already hold the exact ids the
  policy saw and sampled, so a multi-turn trajectory is one row with its observations (tool results, user turns)
  masked, as in RL. Curating an eval run this way is rLLM's eval → curate → SFT.
  Calls captured without token ids (a reference-solution oracle's, an API model's) are rendered from their own
  messages and reply, as the chat data below.
- **Chat JSONL**, one `{"messages": [...], "tools": [...]}` per line (OpenAI chat format; `tools` optional): each
  assistant message becomes a Step whose prompt is the conversation before it rendered with the model's chat
  template and a generation prompt (as the policy server renders a request; tools a template cannot show go into
  the messages in the Hermes convention, as the server writes them), and whose completion is what rendering the
  message adds, up to and including the end-of-turn token. Packed like episodes, every assistant turn is trained
  and every other token (system, user, tool results, the template's own markup) is masked.

Every SFT row is scored at temperature 1 with advantage 1 on its trained tokens: with `--loss sft` that is the
negative log-likelihood of the assistant tokens. What was skipped and why is counted, never dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from rllm_core.errors import ConfigError
from rllm_core.runs.media import MEDIA_SCHEME, inline_media, media_dir_for
from rllm_core.types import Episode, Step, Trajectory
from rllm_rollout.capture.images import message_images
from rllm_serve.tool_prompt import ChatRenderer
from rllm_train.packing import OverlongRule, TrainRow, pack_trajectory
from rllm_train.sft_vision import vision_step

__all__ = ["EpisodeFilter", "chat_trajectory", "eos_ids", "episode_files", "rendered_trajectory", "sft_rows_from_chat",
           "sft_rows_from_episodes"]

Counts = dict[str, float]


class EpisodeFilter(BaseModel):
    """Which episodes (and which of their trajectories) an SFT set keeps; every condition given must hold."""

    min_reward: float | None = None
    reasons: list[str] = Field(default_factory=list)
    """Keep episodes with one of these reward reasons (`correct`, ...)."""
    benchmarks: list[str] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)
    """Keep only trajectories of these roles (their names: `solver`, `claude-code`, ...)."""
    where: str | None = None
    """A Python expression over `episode` (an rllm Episode), e.g. `len(episode.steps) <= 6`."""

    def predicate(self) -> Callable[[Episode], bool]:
        code = None
        if self.where:
            try:
                code = compile(self.where, "--where", "eval")
            except SyntaxError as exc:
                raise ConfigError(f"--where {self.where!r} is not a Python expression: {exc.msg}") from None

        def keeps(episode: Episode) -> bool:
            if self.min_reward is not None and (episode.reward is None or episode.reward < self.min_reward):
                return False
            if self.reasons and episode.reward_reason not in self.reasons:
                return False
            if self.benchmarks and episode.task.benchmark not in self.benchmarks:
                return False
            if code is None:
                return True
            try:
                return bool(eval(code, {}, {"episode": episode}))  # the user's own expression, on their machine
            except Exception as exc:
                raise ConfigError(f"--where {self.where!r} failed on episode {episode.id}: "
                                  f"{type(exc).__name__}: {exc}") from None

        return keeps


def episode_files(source: Path) -> list[Path]:
    """The episodes files of a run (`episodes/*.jsonl` of `rllm train`, `episodes.jsonl` of `rllm eval`) or the
    file itself."""
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise ConfigError(f"no run or file at {source}: give a run directory of rllm train / rllm eval, an episodes "
                          ".jsonl or a chat .jsonl")
    files = sorted((source / "episodes").glob("*.jsonl")) if (source / "episodes").is_dir() else []
    files += [source / "episodes.jsonl"] if (source / "episodes.jsonl").is_file() else []
    if not files:
        raise ConfigError(f"{source} holds no episodes (no episodes/*.jsonl or episodes.jsonl): run it with "
                          "episodes saved, or give a file")
    return files


def _json_lines(path: Path, counts: Counts) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each JSON object line; an episode's stored images (`rllm-media://`) inlined again from its run's media."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
                if MEDIA_SCHEME in line:
                    value = inline_media(value, media_dir_for(path))
            except ValueError:
                counts["lines_unreadable"] = counts.get("lines_unreadable", 0.0) + 1
                continue
            except OSError as exc:
                raise ConfigError(f"{path}:{number} refers to a stored image that cannot be read ({exc})") from None
            if isinstance(value, dict):
                yield number, value
            else:
                counts["lines_unreadable"] = counts.get("lines_unreadable", 0.0) + 1


def _sft_rows(trajectory: Trajectory, group: str, max_seq_len: int | None, overlong: OverlongRule, counts: Counts
              ) -> list[TrainRow]:
    rows, metrics = pack_trajectory(trajectory, 1.0, group_id=group, max_tokens=max_seq_len, overlong=overlong)
    for key, value in metrics.items():
        counts[key] = counts.get(key, 0.0) + value
    return [row.model_copy(update={"temperature": 1.0}) for row in rows]


def sft_rows_from_episodes(source: Path, keep: EpisodeFilter, *, max_seq_len: int | None = None,
                           overlong: OverlongRule = "truncate", tokenizer: Callable[[], Any] | None = None,
                           processor: Callable[[], Any] | None = None) -> tuple[list[TrainRow], Counts]:
    """Rows of the kept episodes' trajectories (module docstring) and counts of what was read, kept and skipped.
    Calls captured without token ids are rendered from their messages with `tokenizer()` (`rendered_trajectory`)."""
    predicate = keep.predicate()
    counts: Counts = {"episodes_read": 0.0, "episodes_kept": 0.0}
    rows: list[TrainRow] = []
    for path in episode_files(source):
        for number, data in _json_lines(path, counts):
            try:
                episode = Episode.model_validate(data)
            except ValidationError as exc:
                raise ConfigError(f"{path}:{number} is not an episode ({exc.errors()[0]['msg']}); for chat data "
                                  "each line holds {\"messages\": [...]}") from None
            counts["episodes_read"] += 1
            if not predicate(episode):
                continue
            counts["episodes_kept"] += 1
            for trajectory in episode.trajectories:
                if keep.roles and trajectory.name not in keep.roles:
                    continue
                if tokenizer is not None and any(not s.trainable and s.messages for s in trajectory.steps):
                    trajectory = rendered_trajectory(trajectory, tokenizer(), eos_ids(tokenizer()),
                                                     processor() if processor is not None else None)
                rows += _sft_rows(trajectory, episode.id, max_seq_len, overlong, counts)
    return rows, counts


class ChatTemplateMismatch(ConfigError):
    """The chat template renders a conversation so that an earlier turn changes when a later one is added."""


def eos_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's eos: where the policy server stops a turn (an instruct model's eos is its end of turn)."""
    return frozenset({tokenizer.eos_token_id} if isinstance(tokenizer.eos_token_id, int) else set())


def _chat_step(renderer: ChatRenderer, before: list[dict[str, Any]], upto: list[dict[str, Any]],
               end_of_turn_ids: frozenset[int], where: str) -> Step | None:
    """The Step of the last assistant message of `upto` (prepared messages), `before` being those before it."""
    prompt, full = renderer.ids(before, True), renderer.ids(upto, False)
    if full[: len(prompt)] != prompt:
        raise ChatTemplateMismatch(f"the chat template renders {where} so that the text before it changes (it "
                                   "rewrites earlier turns): its tokens cannot be cut out exactly")
    completion = full[len(prompt):]
    ends = [k for k, t in enumerate(completion) if t in end_of_turn_ids]
    if ends:  # the template's newline after the end-of-turn token is the next prompt's, not a sampled token
        completion = completion[: ends[0] + 1]
    if not completion:
        return None
    return Step(prompt_token_ids=prompt, completion_token_ids=completion, logprobs=[0.0] * len(completion),
                token_source="retokenized", text=str(upto[-1].get("content") or ""))


def chat_trajectory(messages: list[dict[str, Any]], tokenizer: Any, *, tools: list[dict[str, Any]] | None = None,
                    end_of_turn_ids: frozenset[int] = frozenset(), name: str = "sft") -> Trajectory:
    """One Step per assistant message of `messages` (module docstring); logprobs 0 (no sampler: `--loss sft`
    does not use them)."""
    renderer = ChatRenderer(tokenizer, tools)
    plain = renderer.messages(messages)
    steps = [_chat_step(renderer, plain[:i], plain[: i + 1], end_of_turn_ids, f"assistant message {i}")
             for i, m in enumerate(plain) if m.get("role") == "assistant"]
    return Trajectory(name=name, steps=[s for s in steps if s is not None])


def rendered_trajectory(trajectory: Trajectory, tokenizer: Any, end_of_turn_ids: frozenset[int],
                        processor: Any = None) -> Trajectory:
    """A captured trajectory without token ids (an upstream that returned none: a reference-solution oracle, an
    API model) as Steps rendered from each call's own messages and reply, exactly as the policy server would render
    that request; one Step per call, so consecutive calls merge into one row where the history only grows."""
    steps = []
    for k, step in enumerate(trajectory.steps):
        if step.trainable or step.messages is None or step.error is not None:
            steps.append(step)
            continue
        reply: dict[str, Any] = {"role": "assistant", "content": step.text or ""}
        if step.tool_calls:
            reply["tool_calls"] = step.tool_calls
        if processor is not None and message_images(step.messages):  # a vision-language model's call
            made = vision_step(processor, step.messages, reply, end_of_turn_ids,
                               f"call {k} of trajectory {trajectory.name!r}")
            steps += [made] if made is not None else []
            continue
        tools = step.params.get("tools") if isinstance(step.params.get("tools"), list) else None
        renderer = ChatRenderer(tokenizer, tools)
        full = renderer.messages([*step.messages, reply])
        made = _chat_step(renderer, full[:-1], full, end_of_turn_ids, f"call {k} of trajectory {trajectory.name!r}")
        if made is not None:
            steps.append(made)
    return trajectory.model_copy(update={"steps": steps})


def sft_rows_from_chat(path: Path, tokenizer: Any, *, end_of_turn_ids: frozenset[int] = frozenset(),
                       max_seq_len: int | None = None, overlong: OverlongRule = "truncate"
                       ) -> tuple[list[TrainRow], Counts]:
    """Rows of a chat JSONL file (module docstring); a line without messages is one ConfigError naming it."""
    counts: Counts = {"conversations": 0.0}
    rows: list[TrainRow] = []
    for number, data in _json_lines(path, counts):
        messages, tools = data.get("messages"), data.get("tools")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ConfigError(f"{path}:{number} has no \"messages\" list of {{\"role\", \"content\"}} objects")
        if not any(m["role"] == "assistant" for m in messages):
            counts["conversations_without_assistant"] = counts.get("conversations_without_assistant", 0.0) + 1
            continue
        try:
            trajectory = chat_trajectory(messages, tokenizer, tools=tools if isinstance(tools, list) else None,
                                         end_of_turn_ids=end_of_turn_ids)
        except ChatTemplateMismatch as exc:
            raise ConfigError(f"{path}:{number}: {exc}") from None
        counts["conversations"] += 1
        rows += _sft_rows(trajectory, f"{path.name}:{number}", max_seq_len, overlong, counts)
    return rows, counts
