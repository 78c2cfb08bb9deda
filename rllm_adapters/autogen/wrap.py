"""`wrap_team`: one Trajectory per AutoGen agent, for RoundRobinGroupChat, SelectorGroupChat or one agent.

The team is changed in place (and returned): each agent's model client is replaced by a `NamedModelClient`
carrying the agent's name; a SelectorGroupChat's own client (the speaker selection calls) is named
`manager_name`; nested teams (SocietyOfMindAgent) are wrapped too. The team's `run_stream` (which `run`
goes through) binds the episode it was called in, so calls land in that episode even when AutoGen's runtime
runs the agents in a context that belongs to another one. Before each run an existing group chat manager
(created at the team's first run or reset, holding the client of that moment) is given the team's wrapped
client, so a reused SelectorGroupChat's speaker selection follows the episode too.

AutoGen keeps model clients in private attributes (`_model_client`) and offers no public way to replace
them; that one access is kept here, checked, and fails with a clear error when AutoGen changes it.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from autogen_core import AgentId
from autogen_core.models import ChatCompletionClient

from rllm_adapters._common import check_version, finish_adhoc_episode, open_adhoc_episode
from rllm_adapters.autogen.client import EpisodeBinding, NamedModelClient
from rllm_adapters.autogen.plugin import TESTED_VERSIONS
from rllm_core.context import EpisodeContext, current_episode
from rllm_core.types import Episode

__all__ = ["adhoc_episodes", "named_clients", "wrap_team"]

log = logging.getLogger("rllm.adapters.autogen")

check_version("autogen-ext", TESTED_VERSIONS, adapter="autogen")

adhoc_episodes: deque[Episode] = deque(maxlen=256)
"""Episodes built from wrapped teams run outside @rllm.rollout (one per run), newest last."""

T = TypeVar("T")

_CLIENT_ATTR = "_model_client"
_TEAM_ATTR = "_team"
_MARK = "__rllm_binding__"
_LATE = "__rllm_wrapped_after_init__"
"""Set on a group chat wrapped after its manager was created, until that manager has been given the client."""
_REPOINTABLE = ".OpenAIChatCompletionClient"
"""Provider suffix of the clients whose config has a plain `base_url` (Azure's has an endpoint instead)."""


def wrap_team(team: T, *, base_url: str | None = None, api_key: str | None = None,
              manager_name: str = "selector") -> T:
    """Name every model call of `team` after the agent that made it; returns the same (mutated) team.

    Args:
        team: a RoundRobinGroupChat, SelectorGroupChat (or other BaseGroupChat), or a single agent.
        base_url: point every OpenAI-compatible model client at this URL, e.g. the episode's
            `config.base_url` (the gateway session URL) when the team was built for another endpoint.
        api_key: with `base_url`, the key those clients send there: the episode's `config.api_key` (the
            gateway's client token), since the one the team was built with belongs to the other endpoint.
        manager_name: the trajectory name for calls made by the team itself (SelectorGroupChat's selector).

    Calling it again on a wrapped team only re-points the clients (with `base_url`).
    """
    if not (hasattr(team, "run_stream") and (hasattr(team, "_participants") or hasattr(team, "name"))):
        raise TypeError(
            f"wrap_team expects an AutoGen team (RoundRobinGroupChat, SelectorGroupChat, ...) or agent "
            f"(AssistantAgent, ...), got {type(team).__name__}"
        )
    if api_key is not None and base_url is None:
        raise ValueError("wrap_team(api_key=...) goes with base_url=...: it is the key sent to that URL")
    binding: EpisodeBinding | None = getattr(team, _MARK, None)
    if binding is None:
        binding = EpisodeBinding()
        _bind_runs(team, binding)
    _wrap_members(team, binding, base_url=base_url, api_key=api_key, manager_name=manager_name,
                  team_name=type(team).__name__)
    return team


def named_clients(team: Any) -> dict[str, NamedModelClient]:
    """The wrapped clients of a team, by agent name (what `wrap_team` did; for checks and debugging)."""
    out: dict[str, NamedModelClient] = {}
    for owner in _owners(team):
        client = getattr(owner, _CLIENT_ATTR, None)
        if isinstance(client, NamedModelClient):
            out[client.agent] = client
    return out


def _owners(team: Any) -> list[Any]:
    """The team itself, every participant, and the members of nested teams."""
    out = [team]
    for member in list(getattr(team, "_participants", None) or []):
        out.extend(_owners(member))
    inner = getattr(team, _TEAM_ATTR, None)
    if inner is not None and inner is not team:
        out.extend(_owners(inner))
    return out


def _wrap_members(team: Any, binding: EpisodeBinding, *, base_url: str | None, api_key: str | None,
                  manager_name: str, team_name: str) -> None:
    for owner in _owners(team):
        client = getattr(owner, _CLIENT_ATTR, None)
        if client is None:
            continue
        if not isinstance(client, ChatCompletionClient):
            raise TypeError(f"{type(owner).__name__}.{_CLIENT_ATTR} is a {type(client).__name__}, not an AutoGen "
                            "ChatCompletionClient; this AutoGen version is not supported by rllm_adapters.autogen")
        is_team = hasattr(owner, "_participants")
        name = manager_name if is_team else str(getattr(owner, "name", type(owner).__name__))
        inner = client.inner if isinstance(client, NamedModelClient) else client
        if base_url is not None:
            inner = _repoint(inner, base_url, api_key)
        if isinstance(client, NamedModelClient) and client.binding is binding:
            # Re-wrap in place: AutoGen may hold this very object (a group chat manager keeps the selector's
            # client from its creation on), so it must see the new endpoint, not a replacement it never reads.
            client.inner, client.agent, client.team = inner, name, team_name
        else:
            if is_team and getattr(owner, "_initialized", False):
                setattr(owner, _LATE, True)  # its manager already holds the unwrapped client: see _sync_managers
            setattr(owner, _CLIENT_ATTR, NamedModelClient(inner, agent=name, binding=binding, team=team_name))


def _repoint(client: ChatCompletionClient, base_url: str, api_key: str | None = None) -> ChatCompletionClient:
    """A copy of an OpenAI-compatible client sending to `base_url` (through AutoGen's public component API)."""
    model = client.dump_component()
    if not model.provider.endswith(_REPOINTABLE):
        raise TypeError(
            f"wrap_team(base_url=...) only re-points autogen_ext's OpenAIChatCompletionClient, not "
            f"{type(client).__name__} ({model.provider}); build that client with the episode's config.base_url "
            "yourself, or call wrap_team without base_url="
        )
    config = {**model.config, "base_url": base_url, **({"api_key": api_key} if api_key is not None else {})}
    return type(client).load_component(model.model_copy(update={"config": config}))


@contextmanager
def _bound(binding: EpisodeBinding) -> Iterator[None]:
    """Bind the caller's episode (an ad-hoc one outside @rllm.rollout) for the duration of one run."""
    ctx = current_episode() or open_adhoc_episode("autogen")
    previous, binding.ctx = binding.ctx, ctx
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        if binding.ctx is ctx:  # a run AutoGen refused (the team was already running) must not unbind that run
            binding.ctx = previous
        _finish_adhoc(ctx, error)


def _bind_runs(team: Any, binding: EpisodeBinding) -> None:
    """Make `run_stream` (and `run` for agents, which does not go through it) bind the caller's episode."""
    orig_stream = team.run_stream

    @functools.wraps(orig_stream)
    async def run_stream(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        await _sync_managers(team)
        with _bound(binding):
            async for item in orig_stream(*args, **kwargs):
                yield item

    team.run_stream = run_stream
    if not hasattr(team, "_participants"):  # an agent: its run() calls on_messages, not run_stream
        orig_run = team.run

        @functools.wraps(orig_run)
        async def run(*args: Any, **kwargs: Any) -> Any:
            with _bound(binding):
                return await orig_run(*args, **kwargs)

        team.run = run
    setattr(team, _MARK, binding)


async def _sync_managers(team: Any) -> None:
    """Give every initialised group chat manager its team's wrapped client before a run.

    A group chat creates its manager (which makes the SelectorGroupChat's speaker selection calls) on its first
    `run` or `reset`, handing it the team's `_model_client` of that moment. A team wrapped after that (the
    usual `await team.reset(); wrap_team(team, base_url=...)` per episode) would have the selector keep its
    first client: calls unattributed, sent to the first endpoint, or to a previous episode's gateway session.
    The manager is reached through the runtime's public `try_get_underlying_agent_instance`.
    """
    for owner in _owners(team):
        client = getattr(owner, _CLIENT_ATTR, None)
        if not (hasattr(owner, "_participants") and isinstance(client, NamedModelClient)
                and getattr(owner, "_initialized", False)):
            continue
        try:
            manager = await owner._runtime.try_get_underlying_agent_instance(
                AgentId(owner._group_chat_manager_topic_type, owner._team_id))
        except (AttributeError, LookupError, NotImplementedError, TypeError) as exc:
            if getattr(owner, _LATE, False):
                raise RuntimeError(
                    f"rllm_adapters.autogen: {type(owner).__name__} was run or reset before wrap_team, and its "
                    f"group chat manager cannot be reached on {type(getattr(owner, '_runtime', None)).__name__} "
                    f"({exc!r}) to give it the wrapped model client; call wrap_team(team) before the team's "
                    "first run() / reset()"
                ) from exc
            continue  # wrapped before its first run: the manager already holds the (in-place updated) client
        if hasattr(manager, _CLIENT_ATTR) and getattr(manager, _CLIENT_ATTR) is not client:
            setattr(manager, _CLIENT_ATTR, client)
        setattr(owner, _LATE, False)


def _finish_adhoc(ctx: EpisodeContext, error: BaseException | None) -> None:
    """Keep a run made outside @rllm.rollout as an ad-hoc Episode; a failure here never reaches the agent."""
    if not ctx.adhoc:
        return
    try:
        adhoc_episodes.append(finish_adhoc_episode(ctx, "autogen", repr(error) if error else None))
    except Exception:
        log.exception("rllm_adapters.autogen: could not build the ad-hoc episode %s", ctx.session_id)
