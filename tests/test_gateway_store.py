"""The gateway's stores: one lifecycle suite run over both (memory, SQLite), then what only a durable store
does: Steps that survive a real gateway restart on the same port and file, a `RemoteGateway` that retries
across that restart, a take retried after a lost reply, and concurrent writers on one file."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from rllm_core.errors import ConfigError, UpstreamError
from rllm_core.types import Step
from rllm_rollout.gateway import RemoteGateway, UpstreamConfig, start_gateway
from rllm_rollout.gateway.config import StoreLimits
from rllm_rollout.gateway.open_store import open_store
from rllm_rollout.gateway.sqlite_store import SqliteStore
from rllm_rollout.gateway.store import DEFAULT_SESSION, MemoryStore, Store
from rllm_testing.fake_upstream import FakeUpstream

MSGS = [{"role": "user", "content": "hello"}]


class Clock:
    """A clock the test moves: TTLs are checked without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def step(text: str) -> Step:
    return Step(text=text, completion_token_ids=[1, 2], logprobs=[-0.5, float("nan")])


def texts(steps: list[Step]) -> list[str | None]:
    return [s.text for s in steps]


MakeStore = Callable[..., Store]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeStore]:
    """Builds a store of the parametrized kind with the given limits and the test's clock; closes them all."""
    made: list[Store] = []

    def make(clock: Clock | None = None, **limits: float) -> Store:
        lim = StoreLimits(**limits)  # type: ignore[arg-type]
        clk = clock or Clock()
        s: Store = (MemoryStore(lim, clock=clk) if request.param == "memory"
                    else SqliteStore(tmp_path / f"store{len(made)}.db", lim, clock=clk))
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


# ------------------------------------------------------------------ the same lifecycle in both stores
def test_take_returns_in_order_and_closes(make_store: MakeStore) -> None:
    store = make_store()
    store.add("a", [step("1"), step("2")])
    store.add("a", [step("3")])
    assert texts(store.steps("a")) == ["1", "2", "3"] and store.sessions() == ["a"]
    taken = store.take("a", in_flight=2)
    assert texts(taken.steps) == ["1", "2", "3"] and taken.in_flight == 2 and not taken.retried
    assert taken.steps[0].logprobs is not None and taken.steps[0].logprobs[0] == -0.5  # NaN round-trips too
    assert store.is_closed("a") and store.sessions() == [] and store.steps("a") == []
    assert store.add("a", [step("late")]) == 1  # dropped, never re-opening it
    assert store.sessions() == [] and store.take("a").steps == []
    st = store.stats()
    assert st.late_steps == 1 and st.closed_sessions == 1 and st.open_sessions == 0 and st.stored_steps == 0


def test_delete_closes_and_a_never_seen_session_taken_is_closed_too(make_store: MakeStore) -> None:
    store = make_store()
    store.add("d", [step("x"), step("y")])
    assert store.delete("d") == 2 and store.is_closed("d")
    assert store.take("never").steps == [] and store.is_closed("never")
    assert store.add("never", [step("late")]) == 1 and store.stats().late_steps == 1


def test_default_session_is_drained_not_closed_and_capped(make_store: MakeStore,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    store = make_store(max_default_steps=3)
    with caplog.at_level(logging.WARNING, "rllm.gateway"):
        for i in range(5):
            store.add(DEFAULT_SESSION, [step(str(i))])
    assert texts(store.steps(DEFAULT_SESSION)) == ["2", "3", "4"]  # the oldest dropped
    assert store.stats().default_dropped_steps == 2 and "default session holds more than 3" in caplog.text
    assert texts(store.take(DEFAULT_SESSION).steps) == ["2", "3", "4"]
    assert not store.is_closed(DEFAULT_SESSION) and store.add(DEFAULT_SESSION, [step("5")]) == 0
    assert texts(store.steps(DEFAULT_SESSION)) == ["5"]


def test_idle_sessions_and_tombstones_expire(make_store: MakeStore, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    store = make_store(clock, session_ttl_s=60, closed_ttl_s=30)
    store.add("idle", [step("a")])
    store.add("busy", [step("b")])
    store.take("done")
    clock.advance(40)
    store.add("busy", [step("c")])  # activity keeps a session alive
    assert not store.is_closed("done")  # the tombstone outlived closed_ttl_s: a very late step may re-open it
    clock.advance(30)
    with caplog.at_level(logging.WARNING, "rllm.gateway"):
        st = store.stats()
    assert store.sessions() == ["busy"] and texts(store.steps("busy")) == ["b", "c"]
    assert st.expired_sessions == 1 and st.expired_steps == 1 and st.closed_sessions == 0
    assert "session idle expired after 60 s idle with 1 step(s) never taken" in caplog.text


def test_bounds_on_open_and_closed_sessions(make_store: MakeStore) -> None:
    clock = Clock()
    store = make_store(clock, max_sessions=2, max_closed=2)
    for sid in ("s1", "s2", "s3"):
        store.add(sid, [step(sid)])
        clock.advance(1)
    assert sorted(store.sessions()) == ["s2", "s3"]  # the least recently active dropped
    for sid in ("c1", "c2", "c3"):
        store.take(sid)
        clock.advance(1)
    st = store.stats()
    assert st.evicted_sessions == 1 and st.evicted_steps == 1 and st.forgotten_closed == 1
    assert st.closed_sessions == 2 and not store.is_closed("c1") and store.is_closed("c3")


def test_a_take_with_an_id_is_kept_for_a_retry_until_acked_or_expired(make_store: MakeStore) -> None:
    clock = Clock()
    store = make_store(clock, take_grace_s=10)
    store.add("t", [step("1"), step("2")])
    first = store.take("t", take_id="A", in_flight=1)
    again = store.take("t", take_id="A", in_flight=0)  # the reply was lost: the client asks again
    assert texts(again.steps) == ["1", "2"] and again.in_flight == 1 and again.retried
    assert store.take("t", take_id="B").steps == []  # another take of a closed session: nothing
    assert store.stats().retried_takes == 1 and store.stats().kept_takes == 2
    assert store.ack("t", "A") and not store.ack("t", "A")
    assert store.take("t", take_id="A").steps == []  # acked: forgotten
    clock.advance(11)
    assert store.stats().kept_takes == 0  # B was never acked: dropped after the grace
    assert texts(first.steps) == ["1", "2"]


def test_concurrent_writers_lose_and_duplicate_nothing(make_store: MakeStore) -> None:
    store = make_store()
    n_threads, n_sessions, n_steps = 8, 20, 3

    def writer(t: int) -> None:
        for i in range(n_sessions):
            for k in range(n_steps):
                store.add(f"w{t}-{i}", [step(f"{t}-{i}-{k}")])

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert store.stats().stored_steps == n_threads * n_sessions * n_steps
    for t in range(n_threads):
        for i in range(n_sessions):
            assert texts(store.take(f"w{t}-{i}").steps) == [f"{t}-{i}-{k}" for k in range(n_steps)]


# ------------------------------------------------------------------ specs and SQLite only
def test_store_specs_and_bad_ones(tmp_path: Path) -> None:
    assert isinstance(open_store(None), MemoryStore) and isinstance(open_store("memory"), MemoryStore)
    s = open_store(f"sqlite:{tmp_path / 'x.db'}")
    assert isinstance(s, SqliteStore)
    s.close()
    with pytest.raises(ConfigError, match="'memory' or 'sqlite:PATH'"):
        open_store("redis://x")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"cannot open the gateway store .* choose a writable path"):
        SqliteStore(tmp_path / "a-file" / "x.db")  # its folder is a file


def test_two_sqlite_stores_on_one_file_write_concurrently(tmp_path: Path) -> None:
    """Two gateway processes sharing a file: SQLite's locking serializes them, nothing is lost."""
    a, b = SqliteStore(tmp_path / "shared.db"), SqliteStore(tmp_path / "shared.db")
    try:
        def write(store: SqliteStore, tag: str) -> None:
            for i in range(100):
                store.add(f"{tag}{i % 5}", [step(f"{tag}{i}")])

        threads = [threading.Thread(target=write, args=(s, tag)) for s, tag in ((a, "a"), (b, "b"))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert a.stats().stored_steps == 200
        assert texts(b.take("a0").steps) == [f"a{i}" for i in range(0, 100, 5)]
        assert a.is_closed("a0")  # closed through the other process's store
    finally:
        a.close()
        b.close()


def post_chat(gw_url: str, sid: str, token: str) -> httpx.Response:
    return httpx.post(f"{gw_url}/sessions/{sid}/v1/chat/completions", json={"model": "m", "messages": MSGS},
                      headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_steps_and_closed_sessions_survive_a_gateway_restart(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    spec, up = f"sqlite:{tmp_path / 'gw.db'}", [UpstreamConfig(url=fake_upstream.base_url)]
    with start_gateway(up, api_key="k", store=spec) as gw:
        port = gw.port
        assert post_chat(gw.url, "kept", "k").status_code == 200
        assert post_chat(gw.url, "gone", "k").status_code == 200
        assert len(gw.take_steps("gone")) == 1
    with start_gateway(up, port=port, api_key="k", store=spec) as gw2:  # a new gateway, same port and file
        [s] = RemoteGateway(gw2.url, api_key="k").take_steps("kept")
        assert s.token_source == "server" and s.messages == MSGS
        r = post_chat(gw2.url, "gone", "k")  # taken before the restart: still closed after it
        assert r.status_code == 410 and "already taken" in r.json()["error"]["message"]


def test_a_generated_token_is_kept_in_the_file_so_clients_outlive_a_restart(fake_upstream: FakeUpstream,
                                                                           tmp_path: Path) -> None:
    spec, up = f"sqlite:{tmp_path / 'gw.db'}", [UpstreamConfig(url=fake_upstream.base_url)]
    with start_gateway(up, store=spec) as gw:  # no api_key: one is generated, and stored with the steps
        token, port = gw.client_api_key, gw.port
        assert token and post_chat(gw.url, "a", token).status_code == 200
    with start_gateway(up, port=port, store=spec) as gw2:
        assert gw2.client_api_key == token
        assert len(RemoteGateway(gw2.url, api_key=token).take_steps("a")) == 1
    with start_gateway(up, store="memory") as other:  # a store that keeps nothing: a fresh token each start
        assert other.client_api_key and other.client_api_key != token


def test_remote_gateway_retries_across_a_restart_and_a_lost_take_reply_is_not_lost(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    spec, up = f"sqlite:{tmp_path / 'gw.db'}", [UpstreamConfig(url=fake_upstream.base_url)]
    gw = start_gateway(up, api_key="k", store=spec)
    port, url = gw.port, gw.url
    try:
        client = openai.OpenAI(base_url=gw.session_base_url("r"), api_key="k", max_retries=0)
        client.chat.completions.create(model="m", messages=MSGS)
        # a take whose reply never reached its client: the same take id after a restart gets the same steps
        lost = httpx.post(f"{url}/sessions/r/take", params={"take_id": "T1"}, headers={"Authorization": "Bearer k"})
        assert len(lost.json()) == 1
        client.close()
        post_chat(url, "s", "k")
        gw.stop()
        restarted: dict[str, object] = {}

        def restart() -> None:
            time.sleep(1.0)  # the client's first tries are refused
            restarted["gw"] = start_gateway(up, port=port, api_key="k", store=spec)

        th = threading.Thread(target=restart)
        th.start()
        started = time.monotonic()
        taken = RemoteGateway(url, api_key="k", retry_s=20).take("s")  # refused, retried, then served
        th.join()
        assert time.monotonic() - started >= 0.9 and len(taken.steps) == 1 and taken.in_flight == 0
        again = httpx.post(f"{url}/sessions/r/take", params={"take_id": "T1"}, headers={"Authorization": "Bearer k"})
        assert again.json() == lost.json()
        assert httpx.get(f"{url}/stats", headers={"Authorization": "Bearer k"}).json()["retried_takes"] == 1
    finally:
        gw.stop()
        if "gw" in restarted:
            restarted["gw"].stop()  # type: ignore[attr-defined]


def test_remote_gateway_gives_up_after_its_retry_time(fake_upstream: FakeUpstream) -> None:
    gw = start_gateway([UpstreamConfig(url=fake_upstream.base_url)])
    url, token = gw.url, gw.client_api_key
    gw.stop()
    started = time.monotonic()
    with pytest.raises(UpstreamError, match=r"unreachable .* after retrying for 0\.5 s"):
        RemoteGateway(url, api_key=token, retry_s=0.5).take("x")
    assert 0.4 < time.monotonic() - started < 10
