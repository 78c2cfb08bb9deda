"""Per-role training options: which estimator, which reward weight and which policy each role of a workflow gets.

A multi-agent episode's trajectories are named by role (`solver`, `judge`, `debater`, a LangGraph node's name);
several agents playing one role (`solver#0`, `solver#1`) are the same role. Three options are maps keyed by role,
written on the command line as `role=value,role=value` and in YAML as mappings:

    --estimator solver=grpo,judge=reinforce      advantage estimator per role ('*': every other role)
    --role-weights solver=1,judge=0.5            scales a role's advantages (0: the role is not trained)
    --roles debater=lora:debater,moderator=lora:moderator
                                                 a policy per role: 'lora:NAME' trains the role as its own LoRA
                                                 adapter NAME on the shared base model; roles not named share
                                                 one adapter, `shared`

With --roles the base weights stay frozen and every role trains an adapter; the policy server serves all of
them at once, and the gateway sends each role's calls with its adapter's name as the model, so the agent's
code never changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.roles import role_of_agent

__all__ = [
    "SHARED_ADAPTER",
    "adapter_for_role",
    "adapter_names",
    "check_policy_spec",
    "check_recorded_roles",
    "check_role_names",
    "parse_role_map",
    "role_models",
    "weigh_advantages",
]

SHARED_ADAPTER = "shared"
"""The adapter of every role that --roles does not name."""

_ADAPTER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


def parse_role_map(value: Any, option: str) -> Any:
    """'solver=grpo,judge=reinforce' → {'solver': 'grpo', 'judge': 'reinforce'}; mappings pass through, any other
    value is returned as is (pydantic then says what is wrong with it)."""
    if not isinstance(value, str) or "=" not in value:
        return value
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        role, sep, spec = item.partition("=")
        if not sep or not role.strip() or not spec.strip():
            raise ValueError(f"{option} item {item!r} must look like role=value (e.g. {_EXAMPLES[option]})")
        out[role.strip()] = spec.strip()
    return out


_EXAMPLES = {"estimator": "solver=grpo,judge=reinforce", "role_weights": "solver=1,judge=0.5",
             "roles": "debater=lora:debater,moderator=lora:moderator"}


def check_policy_spec(role: str, spec: str) -> str:
    """The adapter name of one --roles value ('lora:NAME' or 'shared'), or a ValueError saying what to write."""
    kind, _, name = spec.partition(":")
    if spec == SHARED_ADAPTER:
        return SHARED_ADAPTER
    if kind != "lora" or not _ADAPTER_NAME.match(name):
        raise ValueError(f"{role}={spec!r} is not a policy; write {role}=lora:NAME (NAME: letters, digits, "
                         f"'-' or '_') for its own LoRA adapter, or {role}=shared")
    return name


def adapter_for_role(roles: Mapping[str, str], role: str) -> str | None:
    """The LoRA adapter that trains and serves `role` (None: no --roles, one policy for every role)."""
    if not roles:
        return None
    spec = roles.get(role_of_agent(role), SHARED_ADAPTER)
    return check_policy_spec(role, spec)


def adapter_names(roles: Mapping[str, str]) -> list[str]:
    """Every adapter the run trains, `shared` first (it serves roles no one named, and eval of the base name)."""
    if not roles:
        return []
    named = sorted({check_policy_spec(r, s) for r, s in roles.items()} - {SHARED_ADAPTER})
    return [SHARED_ADAPTER, *named]


def role_models(roles: Mapping[str, str]) -> dict[str, str]:
    """role → the model name the gateway sends for its calls ('*': any other role → the shared adapter)."""
    if not roles:
        return {}
    return {**{r: check_policy_spec(r, s) for r, s in roles.items()}, "*": SHARED_ADAPTER}


def weigh_advantages(advantages: Mapping[str, float], groups: Iterable[Any], weights: Mapping[str, float]
                     ) -> dict[str, float]:
    """Trajectory id → advantage × its role's weight (--role-weights; roles not named: 1)."""
    if not weights:
        return dict(advantages)
    role_of = {t.id: g.role for g in groups for t in g.trajectories}
    return {tid: adv * float(weights.get(role_of.get(tid, ""), weights.get("*", 1.0)))
            for tid, adv in advantages.items()}


def check_recorded_roles(episodes: Iterable[Any], configured: Mapping[str, Mapping[str, Any]], name: str,
                         declared: Iterable[str] = ()) -> None:
    """After a step's rollouts: refuse a role whose trajectories recorded no LLM call while other roles did (its
    calls bypass the gateway, so it would silently never train), and — for an agent that declared no roles —
    per-role options naming a role it never played."""
    with_steps: set[str] = set()
    seen: set[str] = set()
    for ep in episodes:
        for traj in ep.trajectories:
            seen.add(traj.name)
            if traj.steps:
                with_steps.add(traj.name)
    if not with_steps:
        return  # nothing recorded at all (every episode failed?): the step's own metrics say why
    silent = sorted(seen - with_steps)
    if silent:
        raise ConfigError(f"{name}: role {', '.join(map(repr, silent))} produced no steps (its trajectories hold no "
                          f"recorded LLM call) while {', '.join(sorted(with_steps))} did: send that role's calls to "
                          "config.base_url (the episode's gateway session) so they are recorded and trained")
    if not tuple(declared):  # a declared workflow's names were checked before the run started
        check_role_names(configured, seen, name)


def check_role_names(configured: Mapping[str, Mapping[str, Any]], known: Iterable[str], workflow: str) -> None:
    """Refuse roles the workflow does not have, in any of the per-role options, listing the roles it has."""
    have = sorted(set(known))
    for option, mapping in configured.items():
        unknown = sorted(r for r in mapping if r != "*" and r not in have)
        if unknown:
            flag = "--" + option.replace("_", "-")
            raise ConfigError(f"{flag}: {workflow} has no role {', '.join(map(repr, unknown))}; its roles are "
                              f"{', '.join(have) or '(none recorded)'}")
