"""Session lifecycle through a real gateway: a taken session is closed (new calls 410, late steps dropped and
counted, never re-creating it), a take says how many calls were still in flight, the rollout puts that on the
episode, and idle sessions and the default session are bounded (TTL with an injected clock)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

import rllm
from rllm_rollout.gateway import GatewayHandle, RemoteGateway, UpstreamConfig, start_gateway
from rllm_rollout.gateway.config import StoreLimits
from rllm_rollout.gateway.store import IN_FLIGHT_HEADER, MemoryStore
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream

MSGS = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": MSGS}


def auth(gw: GatewayHandle) -> dict[str, str]:
    return {"Authorization": f"Bearer {gw.client_api_key}"}


def wait_for(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def slow() -> Iterator[FakeUpstream]:
    with start_fake_upstream(delay_s=0.8) as up:
        yield up


def test_take_mid_call_reports_it_in_flight_and_drops_its_late_step(slow: FakeUpstream,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    with start_gateway([UpstreamConfig(url=slow.base_url)]) as gw:
        replies: list[int] = []
        call = threading.Thread(target=lambda: replies.append(httpx.post(
            gw.session_base_url("s") + "/chat/completions", json=BODY, headers=auth(gw), timeout=30).status_code))
        call.start()
        wait_for(lambda: gw.stats()["in_flight"] == 1)
        with caplog.at_level(logging.WARNING, "rllm.gateway"):
            r = httpx.post(f"{gw.url}/sessions/s/take", headers=auth(gw))
            assert r.json() == [] and r.headers[IN_FLIGHT_HEADER] == "1"
            call.join(30)
            assert replies == [200]  # the call itself was served
            stats = gw.stats()
        assert stats["late_steps"] == 1 and stats["in_flight"] == 0 and stats["open_sessions"] == 0
        assert "1 step(s) for session s arrived after it was taken: dropped" in caplog.text
        assert gw.store.sessions() == [] and gw.steps("s") == []  # not re-created
        n = len(slow.requests)
        r = httpx.post(gw.session_base_url("s") + "/chat/completions", json=BODY, headers=auth(gw))
        assert r.status_code == 410 and r.json()["error"]["type"] == "session_closed"
        assert len(slow.requests) == n and gw.stats()["refused_calls"] == 1  # never reached the upstream


def test_remote_and_in_process_takes_report_in_flight_calls(slow: FakeUpstream) -> None:
    with start_gateway([UpstreamConfig(url=slow.base_url)]) as gw:
        remote = gw.remote()
        threads = [threading.Thread(target=httpx.post, args=(gw.session_base_url(sid) + "/chat/completions",),
                                    kwargs={"json": BODY, "headers": auth(gw), "timeout": 30})
                   for sid in ("r", "r", "h")]
        for t in threads:
            t.start()
        wait_for(lambda: gw.stats()["in_flight"] == 3)
        try:
            assert remote.take("r").in_flight == 2
            assert gw.take("h").in_flight == 1
        finally:
            for t in threads:
                t.join(30)
            remote.close()
        assert gw.stats()["late_steps"] == 3 and gw.stats()["kept_takes"] == 0  # the remote take was acked
        assert remote.take("r").in_flight == 0 and remote.take_steps("r") == []


@rllm.rollout
def slow_sync_agent(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0, timeout=30)
    client.chat.completions.create(model=config.model, messages=MSGS)  # quick
    client.chat.completions.create(model=config.model, messages=MSGS)  # still running at the timeout
    return "done"


def test_a_timed_out_sync_agent_s_late_call_is_counted_on_the_episode() -> None:
    """The rollout times out while the agent's thread is mid-call: the episode has the first call, says one
    was still in flight, and the late step is dropped (counted) instead of re-creating the session."""
    with start_fake_upstream(delay_s=0.6) as up, start_gateway([UpstreamConfig(url=up.base_url)]) as gw:
        with pytest.warns(rllm.RolloutFailedWarning, match="timed out"):
            ep = slow_sync_agent.run({"id": "t"}, gateway=gw, model="m", timeout_s=1.0)
        assert ep.termination_reason == "timeout" and len(ep.steps) == 1
        assert ep.metrics["capture/late_calls"] == 1.0
        wait_for(lambda: gw.stats()["late_steps"] == 1)
        assert gw.store.sessions() == []
        done = slow_sync_agent.run({"id": "u"}, gateway=gw, model="m")
        assert done.error is None and len(done.steps) == 2 and done.metrics["capture/late_calls"] == 0.0


def test_idle_sessions_expire_and_the_default_session_is_capped(fake_upstream: FakeUpstream,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    store = MemoryStore(StoreLimits(session_ttl_s=60, max_default_steps=2), clock=lambda: now[0])
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)], store=store) as gw, \
            caplog.at_level(logging.WARNING, "rllm.gateway"):
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=gw.client_api_key, max_retries=0)
        for i in range(3):  # no session named: the default one
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"n{i}"}])
        httpx.post(gw.session_base_url("idle") + "/chat/completions", json=BODY, headers=auth(gw))
        assert [s.messages[0]["content"] for s in gw.steps("default")] == ["n1", "n2"]  # oldest dropped
        now[0] += 61
        stats = httpx.get(f"{gw.url}/stats", headers=auth(gw)).json()
        client.close()
    assert stats["default_dropped_steps"] == 1 and stats["expired_sessions"] == 2 and stats["open_sessions"] == 0
    assert "default session holds more than 2 steps" in caplog.text and "session idle expired" in caplog.text


def test_taking_an_unknown_session_closes_it_and_limits_are_validated(fake_upstream: FakeUpstream) -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        StoreLimits(session_ttl_s=0)
    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        remote = RemoteGateway(gw.url, api_key=gw.client_api_key)
        assert remote.take_steps("z") == [] and gw.store.is_closed("z")  # a rollout that made no call
        remote.close()
        assert httpx.delete(f"{gw.url}/sessions/z", headers=auth(gw)).json() == {"deleted": 0}
