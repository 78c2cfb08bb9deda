"""The gateway under concurrent load with upstream faults loses, duplicates and misattributes nothing, and
records every injected failure as an errored Step (benchmarks/gateway_load.py is the same check at 10,000
calls, with figures). Also: the checker itself notices each kind of loss, so a green run means something."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from rllm_core.types import Step
from rllm_rollout.gateway import GatewayHandle, UpstreamConfig, start_gateway
from rllm_testing.faulty_upstream import (
    FAULT_KINDS,
    CallOutcome,
    FaultyUpstream,
    fault_for,
    plan_calls,
    run_session,
    start_faulty_upstream,
    verify,
)

TIMEOUT_S = 0.3
STALL_S = 1.0


def run_load(gw: GatewayHandle, n_calls: int, n_sessions: int, seed: int) -> tuple[list[CallOutcome],
                                                                                      dict[str, list[Step]]]:
    """Every session's calls in turn, sessions concurrently; each session taken over HTTP when it is done."""
    plan = plan_calls(n_calls, n_sessions, seed)
    remote = gw.remote()

    async def go() -> list[tuple[list[CallOutcome], list[Step]]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            return await asyncio.gather(*(run_session(http, gw.session_base_url(sid), gw.client_api_key, specs,
                                                      take=remote.atake_steps) for sid, specs in plan.items()))

    try:
        results = asyncio.run(go())
    finally:
        remote.close()
    return [o for outs, _ in results for o in outs], {sid: steps for sid, (_, steps) in zip(plan, results,
                                                                                          strict=True)}


def test_fault_choice_is_deterministic_and_near_the_rate() -> None:
    markers = [f"MARK-s000-c{i:06d}" for i in range(20_000)]
    fates = [fault_for(m, 7, 0.05) for m in markers]
    assert fates == [fault_for(m, 7, 0.05) for m in markers]
    assert fates != [fault_for(m, 8, 0.05) for m in markers]
    assert 0.04 < sum(f is not None for f in fates) / len(fates) < 0.06
    assert {f for f in fates if f} == set(FAULT_KINDS)


def test_the_checker_catches_each_kind_of_loss() -> None:
    seed, rate = 3, 0.3
    with start_faulty_upstream(seed=seed, fault_rate=rate, stall_s=STALL_S) as up, \
            start_gateway(UpstreamConfig(url=up.base_url, timeout_s=TIMEOUT_S)) as gw:
        outcomes, taken = run_load(gw, 60, 4, seed)
    good = verify(outcomes, taken, seed, rate)
    assert good.ok and good.steps == good.calls == 60, good.examples
    assert set(good.faults_planned) == {"none", *FAULT_KINDS}

    sids = list(taken)
    lost = {**taken, sids[0]: taken[sids[0]][1:]}
    assert verify(outcomes, lost, seed, rate).lost == 1
    dup = {**taken, sids[0]: [*taken[sids[0]], taken[sids[0]][0]]}
    assert verify(outcomes, dup, seed, rate).duplicated == 1
    moved = {**taken, sids[0]: taken[sids[0]][1:], sids[1]: [*taken[sids[1]], taken[sids[0]][0]]}
    rep = verify(outcomes, moved, seed, rate)
    assert (rep.misattributed, rep.lost) == (1, 0) and not rep.ok  # found, but in the wrong session
    clean = next(s for s in taken[sids[0]] if s.error is None)
    broken = [s.model_copy(update={"logprobs": [0.0] * len(s.logprobs or [])}) if s is clean else s
              for s in taken[sids[0]]]
    assert verify(outcomes, {**taken, sids[0]: broken}, seed, rate).tokens_wrong == 1
    wrong_plan = verify(outcomes, taken, seed + 1, rate)  # another seed's fates: errors where none planned
    assert wrong_plan.fault_not_errored and wrong_plan.clean_errored and wrong_plan.client_wrong


@pytest.mark.slow
@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_nothing_lost_under_load_with_faults(store: str, tmp_path: Path) -> None:
    seed, rate, n_calls, n_sessions = 0, 0.05, 500, 16
    spec = "memory" if store == "memory" else f"sqlite:{tmp_path / 'gw.db'}"
    with start_faulty_upstream(seed=seed, fault_rate=rate, stall_s=STALL_S) as up, \
            start_gateway(UpstreamConfig(url=up.base_url, timeout_s=TIMEOUT_S), store=spec) as gw:
        outcomes, taken = run_load(gw, n_calls, n_sessions, seed)
        stats = gw.stats()
        injected = dict(up.injected)
    report = verify(outcomes, taken, seed, rate)
    assert report.ok, report.model_dump()
    assert report.calls == report.steps == n_calls
    assert (report.lost, report.duplicated, report.misattributed) == (0, 0, 0)
    assert all(report.faults_planned.get(k, 0) > 0 for k in FAULT_KINDS), report.faults_planned
    planned = {o.spec.marker: f for o in outcomes if (f := fault_for(o.spec.marker, seed, rate))}
    assert injected == planned  # the upstream failed exactly the calls the checker expected to fail
    errored = sum(s.error is not None for steps in taken.values() for s in steps)
    assert errored == len(planned)
    assert stats["late_steps"] == 0 and stats["in_flight"] == 0 and stats["stored_steps"] == 0
    assert stats["closed_sessions"] == n_sessions


def test_faulty_upstream_rejects_a_bad_rate() -> None:
    with pytest.raises(ValueError, match="fault_rate"), start_faulty_upstream(fault_rate=1.5):
        pass


def test_unmarked_calls_are_served_normally() -> None:
    """A call without a marker is never faulted, whatever the rate (the upstream doubles as a plain fake)."""
    with start_faulty_upstream(fault_rate=0.99) as up:
        assert isinstance(up, FaultyUpstream)

        async def go() -> tuple[int, dict[str, object]]:
            async with aiohttp.ClientSession() as http, http.post(
                    f"{up.base_url}/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}) as resp:
                return resp.status, await resp.json()

        status, body = asyncio.run(go())
    assert status == 200 and body["choices"][0]["message"]["content"] == "ok: hi"  # type: ignore[index]
    assert up.injected == {}
