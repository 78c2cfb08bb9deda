"""Rollouts on Ray: episodes in Ray actors through the driver's gateway, a killed worker, bad addresses, `rllm eval`.

The run tests share one local cluster (class-scoped: Ray start-ups are seconds each on two cores); the
tests of connect_ray itself and of `rllm eval --rollout-workers` start their own, and every test leaves Ray
shut down, failed or not.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # before Ray starts: no token auth on a loopback cluster
ray = pytest.importorskip("ray")

from typer.testing import CliRunner  # noqa: E402

from rllm.cli.app import build_app  # noqa: E402
from rllm_core.errors import ConfigError  # noqa: E402
from rllm_core.io import read_jsonl  # noqa: E402
from rllm_core.net import free_port  # noqa: E402
from rllm_core.types import Episode, group_trajectories  # noqa: E402
from rllm_envs.benchmarks import get_benchmark  # noqa: E402
from rllm_rollout.distributed import RayConnection, RayEpisodes, connect_ray, run_episodes_ray  # noqa: E402
from rllm_rollout.gateway import UpstreamConfig, shared_gateway  # noqa: E402
from rllm_testing.fake_upstream import FakeUpstream, encode, start_fake_upstream, token_logprob  # noqa: E402

pytestmark = pytest.mark.slow

N_TASKS, ATTEMPTS, CONCURRENCY = 16, 2, 8  # 32 episodes, 4 in flight on each of 2 workers
SAMPLING = {"temperature": 0.0, "max_tokens": 16}


def _arith_responder(body: dict[str, Any]) -> str:
    """Right for even first operands, wrong for odd ones (so the driver's scoring is checkable)."""
    text = body["messages"][-1]["content"]
    a, op, b = re.search(r"What is (\d+) ([-+*]) (\d+)", text).groups()  # type: ignore[union-attr]
    value = eval(f"{a}{op}{b}")
    return str(value if int(a) % 2 == 0 else value + 1)


@pytest.fixture
def no_ray_after() -> Iterator[None]:
    """Ray is shut down after the test, whatever happened in it."""
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="class")
def cluster() -> Iterator[RayConnection]:
    """One local 2-CPU cluster for the run tests of a class; shut down after them, even on failure."""
    try:
        with connect_ray(None, num_cpus=2) as conn:
            yield conn
    finally:
        if ray.is_initialized():
            ray.shutdown()


def _expected_step(ep: Episode) -> tuple[list[int], list[int]]:
    """The prompt and completion ids the fake upstream returned for this episode's one call."""
    messages = [{"role": "user", "content": ep.task.instruction}]
    prompt = encode(json.dumps(messages, sort_keys=True, separators=(",", ":")))
    return prompt, encode(_arith_responder({"messages": messages}))


def _check_run(eps: RayEpisodes, tasks: list[Any], *, lost: int = 0) -> None:
    """Every task × attempt back exactly once, in order, with the upstream's exact tokens and logprobs."""
    assert isinstance(eps, list) and len(eps) == N_TASKS * ATTEMPTS == eps.stats.episodes
    assert [(e.task.id, e.attempt) for e in eps] == [(t.id, a) for t in tasks for a in range(ATTEMPTS)]
    assert len({e.id for e in eps}) == len(eps)
    ran = [e for e in eps if e.error is None]
    assert len(eps) - len(ran) == lost
    groups = {g.task_id: len(g.trajectories) for g in group_trajectories(ran)}  # what a trainer would group
    assert groups == Counter(e.task.id for e in ran)
    if not lost:
        assert groups == {t.id: ATTEMPTS for t in tasks}
    for ep in eps:
        if ep.error is not None:
            assert ep.reward_reason == "error" and not ep.steps
            continue
        (step,) = ep.steps
        prompt, completion = _expected_step(ep)
        assert step.trainable and step.token_source == "server"
        assert step.prompt_token_ids == prompt and step.completion_token_ids == completion
        assert step.logprobs == [token_logprob(t) for t in completion]
        want = ep.task.metadata["a"] % 2 == 0  # scored in the driver with the benchmark
        assert ep.is_correct is want and ep.reward_reason == ("correct" if want else "wrong_answer")


class TestOnALocalCluster:
    async def test_every_episode_comes_back_once_with_its_tokens(self, cluster: RayConnection) -> None:
        bench = get_benchmark("arithmetic")
        tasks = bench.load("train", max_examples=N_TASKS)
        seen: list[Episode] = []
        with start_fake_upstream(_arith_responder) as up:
            gateway = shared_gateway([UpstreamConfig(url=up.base_url)]).remote()
            started = time.monotonic()
            eps = await run_episodes_ray(bench.default_rollout(), tasks, workers=2, gateway=gateway, model="fake",
                                         attempts=ATTEMPTS, concurrency=CONCURRENCY, sampling=SAMPLING,
                                         benchmark=bench, progress=False, on_episode=seen.append)
            wall = time.monotonic() - started
            assert len(up.requests) == N_TASKS * ATTEMPTS  # one call per episode, none repeated
        _check_run(eps, tasks)
        assert len(seen) == len(eps)
        stats = eps.stats
        assert (stats.retried, stats.lost, stats.worker_deaths, stats.replaced) == (0, 0, 0, 0)
        assert stats.cpus_per_worker == 0.5 and stats.concurrency_per_worker == CONCURRENCY // 2
        assert sorted(stats.by_worker) == ["worker0.0", "worker1.0"] and sum(stats.by_worker.values()) == 32
        print(f"32 episodes on 2 workers in {wall:.1f} s")

    @pytest.mark.parametrize("retries", [1, 0])
    async def test_a_killed_worker_costs_only_its_in_flight_episodes(self, cluster: RayConnection,
                                                                      retries: int) -> None:
        """Worker 0 is killed (ray.kill, from another thread) while its 4 calls wait on a slow upstream:
        those 4 are retried (retries=1) or come back as errors saying it died (retries=0); the rest run."""
        bench = get_benchmark("arithmetic")
        tasks = bench.load("train", max_examples=N_TASKS)
        killed: list[Any] = []

        def kill_first_worker(actors: list[Any]) -> None:
            if not killed:  # the first call: workers up, nothing finished yet (each call takes 1.5 s)
                killed.append(actors[0])
                threading.Timer(0.5, ray.kill, args=(actors[0],), kwargs={"no_restart": True}).start()

        up: FakeUpstream
        with start_fake_upstream(_arith_responder, delay_s=1.5) as up:
            gateway = shared_gateway([UpstreamConfig(url=up.base_url)]).remote()
            started = time.monotonic()
            eps = await run_episodes_ray(bench.default_rollout(), tasks, workers=2, gateway=gateway, model="fake",
                                         attempts=ATTEMPTS, concurrency=CONCURRENCY, sampling=SAMPLING,
                                         benchmark=bench, progress=False, retries=retries,
                                         on_workers=kill_first_worker)
            wall = time.monotonic() - started
        lost = 0 if retries else CONCURRENCY // 2
        _check_run(eps, tasks, lost=lost)
        stats = eps.stats
        assert stats.worker_deaths == 1 and stats.replaced == 1
        assert (stats.retried, stats.lost) == ((CONCURRENCY // 2, 0) if retries else (0, CONCURRENCY // 2))
        assert sum(stats.by_worker.values()) == 32 - lost and "worker0.1" in stats.by_worker  # the replacement
        for ep in eps:
            if ep.error is not None:
                assert "rollout worker worker0.0 died while running this episode" in ep.error
        print(f"retries={retries}: 32 episodes in {wall:.1f} s, {stats}")

    @pytest.mark.timeout(180)
    async def test_workers_that_keep_dying_end_the_run_with_error_episodes(self, cluster: RayConnection) -> None:
        """Every worker, replacements too, is killed 0.5 s after it is up: once the replacements (one per
        worker) are spent the run still ends, each episode an error that says why, none silently missing."""
        bench = get_benchmark("arithmetic")
        tasks = bench.load("train", max_examples=N_TASKS)

        def kill_all(actors: list[Any]) -> None:
            for actor in actors:
                threading.Timer(0.5, ray.kill, args=(actor,), kwargs={"no_restart": True}).start()

        with start_fake_upstream(_arith_responder, delay_s=1.5) as up:
            gateway = shared_gateway([UpstreamConfig(url=up.base_url)]).remote()
            eps = await run_episodes_ray(bench.default_rollout(), tasks, workers=2, gateway=gateway, model="fake",
                                         attempts=ATTEMPTS, concurrency=CONCURRENCY, sampling=SAMPLING,
                                         benchmark=bench, progress=False, on_workers=kill_all)
        assert [(e.task.id, e.attempt) for e in eps] == [(t.id, a) for t in tasks for a in range(ATTEMPTS)]
        stats = eps.stats
        assert (stats.episodes, stats.lost, stats.worker_deaths, stats.replaced) == (32, 32, 4, 2)
        assert CONCURRENCY <= stats.retried <= 2 * CONCURRENCY and not stats.by_worker
        assert all(e.error and e.reward_reason == "error" for e in eps)
        reasons = Counter("died while running" in (e.error or "") for e in eps)
        assert reasons[True] >= CONCURRENCY and all("died" in (e.error or "") for e in eps)


def test_connect_ray_starts_a_local_cluster_on_loopback_and_stops_it_on_failure(no_ray_after: None) -> None:
    with pytest.raises(RuntimeError, match="boom"), connect_ray(None, num_cpus=2) as conn:
        assert ray.is_initialized() and conn.local and conn.owned and conn.cpus == 2.0
        assert conn.node_ips == ("127.0.0.1",) and conn.single_node
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")  # not on every interface
        with connect_ray(None) as inner:  # already connected: used as it is, and left running
            assert not inner.owned
        assert ray.is_initialized()
        raise RuntimeError("boom")
    assert not ray.is_initialized()


CLUSTER_HOLDER = """
import sys
import ray
from rllm_rollout.distributed import connect_ray
with connect_ray(None, num_cpus=2):
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.readline()
"""


@pytest.fixture
def other_cluster() -> Iterator[str]:
    """A loopback cluster owned by another process (as `ray start` would be); its GCS address."""
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER_HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address), address
        yield address
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the holder leaves its `with`: connect_ray shuts its cluster down
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def test_connect_to_an_existing_cluster_runs_there_and_only_disconnects(
        other_cluster: str, no_ray_after: None, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = get_benchmark("arithmetic")
    tasks = bench.load("train", max_examples=4)
    with start_fake_upstream(_arith_responder) as up:
        gateway = shared_gateway([UpstreamConfig(url=up.base_url)]).remote()
        with connect_ray(other_cluster) as conn:
            assert not conn.local and conn.owned and conn.address == other_cluster and conn.single_node
            eps = await run_episodes_ray(bench.default_rollout(), tasks, workers=1, gateway=gateway, model="fake",
                                         sampling=SAMPLING, benchmark=bench, progress=False)
        assert not ray.is_initialized()
        assert [e.task.id for e in eps] == [t.id for t in tasks] and all(e.steps[0].trainable for e in eps)
        monkeypatch.setenv("RAY_ADDRESS", other_cluster)
        with connect_ray("auto") as conn:  # the same cluster, found through RAY_ADDRESS; still running
            assert conn.address == other_cluster and conn.cpus == 2.0
    assert not ray.is_initialized()


def test_unreachable_ray_address_fails_fast_naming_it(no_ray_after: None, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port("127.0.0.1")
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        started = time.monotonic()
        with pytest.raises(ConfigError, match=re.escape(address) + ".*not reachable"), connect_ray(address):
            pytest.fail("connected to nothing")
        assert time.monotonic() - started < 5
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # where "auto" looks first
    with pytest.raises(ConfigError, match=rf"auto \(127.0.0.1:{port}\).*not reachable"), connect_ray("auto"):
        pytest.fail("connected to nothing")
    with pytest.raises(ConfigError, match="'nonsense' is not an address"), connect_ray("nonsense"):
        pytest.fail("connected to nothing")
    with start_fake_upstream() as up:  # something listens, but not Ray: Ray itself would retry for minutes
        address = up.url.removeprefix("http://")
        started = time.monotonic()
        with pytest.raises(ConfigError, match=re.escape(address) + ".*not a Ray cluster"), connect_ray(address):
            pytest.fail("connected to a web server")
        assert time.monotonic() - started < 5
    assert not ray.is_initialized()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))  # no user model config leaks in
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("args", "expected"), [
    (["--rollout-workers", "-1"], r"--rollout-workers must be 0 or more \(got -1\)"),
    (["--ray-address", "auto"], r"--ray-address auto needs --rollout-workers N"),
])
def test_eval_ray_options_are_checked(in_tmp: Path, no_ray_after: None, args: list[str], expected: str) -> None:
    res = CliRunner().invoke(build_app(), ["eval", "arithmetic", "--base-url", "http://127.0.0.1:9/v1", *args])
    assert res.exit_code == 2 and re.search(expected, " ".join(res.output.split())), res.output


def test_eval_unreachable_ray_address_fails_before_any_work(in_tmp: Path, no_ray_after: None) -> None:
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    started = time.monotonic()
    res = CliRunner().invoke(build_app(), ["eval", "arithmetic", "--base-url", "http://127.0.0.1:9/v1",
                                           "--rollout-workers", "2", "--ray-address", address,
                                           "-o", str(in_tmp / "never"), "--no-progress"])
    assert res.exit_code == 2 and time.monotonic() - started < 5
    flat = " ".join(res.output.split())
    assert f"--ray-address {address} is not reachable" in flat, res.output
    assert not (in_tmp / "never").exists() and not ray.is_initialized()


def test_eval_with_rollout_workers_on_a_local_cluster(in_tmp: Path, no_ray_after: None) -> None:
    with start_fake_upstream(_arith_responder) as up:
        res = CliRunner().invoke(build_app(), [
            "eval", "arithmetic", "-n", "8", "-k", "2", "--base-url", up.base_url, "--model", "fake",
            "--max-tokens", "16", "--rollout-workers", "2", "-o", str(in_tmp / "out"), "--no-progress",
        ], catch_exceptions=False)
        assert len(up.requests) == 16
    assert res.exit_code == 0, res.output
    assert not ray.is_initialized()  # the run's local cluster is gone
    eps = read_jsonl(in_tmp / "out" / "episodes.jsonl")
    assert sorted((e.task.id, e.attempt) for e in eps) == sorted({(e.task.id, a) for e in eps for a in (0, 1)})
    assert len(eps) == 16 and all(e.steps and e.steps[0].trainable for e in eps)
    summary = json.loads((in_tmp / "out" / "summary.json").read_text())
    right = sum(1 for e in eps if e.task.metadata["a"] % 2 == 0)
    assert summary["n_episodes"] == 16 and summary["accuracy"] == pytest.approx(right / 16)
    assert summary["config"]["rollout_workers"] == 2
    ray_stats = summary["config"]["ray"]
    assert ray_stats["address"] == "local" and ray_stats["workers"] == 2 and ray_stats["episodes"] == 16
    assert (ray_stats["retried"], ray_stats["lost"], ray_stats["worker_deaths"]) == (0, 0, 0)
    assert "ray: 2 workers, 0 died, 0 episodes retried, 0 lost" in res.output


def test_the_seed_agent_with_its_placeholder_key_on_ray_workers(in_tmp: Path, no_ray_after: None) -> None:
    """The seed article's agent (api_key="EMPTY") in Ray actors: the session URLs the workers mint are signed, so
    every call is recorded with no key."""
    seed = Path(__file__).resolve().parents[1] / "examples" / "agents" / "seed.py"
    with start_fake_upstream(_arith_responder) as up:
        res = CliRunner().invoke(build_app(), [
            "eval", "arithmetic", "-n", "6", "--agent", f"{seed}:solve", "--base-url", up.base_url, "--model",
            "fake", "--max-tokens", "16", "--rollout-workers", "2", "-o", str(in_tmp / "seed"), "--no-progress",
        ], catch_exceptions=False)
        assert len(up.requests) == 6
    assert res.exit_code == 0, res.output
    eps = read_jsonl(in_tmp / "seed" / "episodes.jsonl")
    assert len(eps) == 6 and all(e.error is None and len(e.steps) == 1 and e.steps[0].trainable for e in eps)


def test_without_ray_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(ConfigError, match=r'pip install "rllm\[ray\]"'), connect_ray(None):
        pytest.fail("started Ray without Ray")


def test_importing_rllm_does_not_import_ray() -> None:
    code = "import sys, rllm, rllm_rollout.distributed, rllm_envs.eval.runner; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
