"""A third-party plugin, installed the way a user would: `rllm plugins` lists it and its capture works; and
a plugin's events on a Ray run, where it is loaded in the driver and in every worker.

The example package (examples/plugins/rllm-requests-adapter) is pip-installed into a temporary target
directory, not into the shared venv, and put on sys.path / PYTHONPATH, where entry points are found.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from test_adapter_support import assert_wire_exact, trajectory_shape

import rllm
from rllm_core.adapters import get_adapters
from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import get_plugin_manager, reset_plugin_manager
from rllm_core.types import Episode, Step, Task
from rllm_testing.fake_upstream import FakeUpstream

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugins" / "rllm-requests-adapter"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    target = tmp_path_factory.mktemp("plugin-target")
    source = tmp_path_factory.mktemp("plugin-src") / EXAMPLE.name
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(  # from a copy: setuptools writes build/ and *.egg-info next to the sources
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(source)],
        check=True, timeout=180,
    )
    yield target


@pytest.fixture
def loaded_plugin(plugin_dir: Path) -> Iterator[Any]:
    """The plugin found through its entry point by a fresh plugin manager; unloaded afterwards."""
    sys.path.insert(0, str(plugin_dir))
    reset_plugin_manager()
    try:
        pm = get_plugin_manager()
        yield pm
    finally:
        import rllm_requests_adapter

        rllm_requests_adapter.uninstall()
        sys.path.remove(str(plugin_dir))
        for name in [m for m in sys.modules if m.startswith("rllm_requests_adapter")]:
            del sys.modules[name]
        reset_plugin_manager()


def test_rllm_plugins_lists_the_installed_plugin(plugin_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "rllm", "plugins", "--json"], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["requests"]["kind"] == "adapter"
    assert rows["requests"]["version"] == "0.1.0" and rows["requests"]["error"] is None
    assert rows["requests"]["source"] == "rllm_requests_adapter.plugin"


@rllm.rollout
def requests_agent(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    url = str(config.upstream_url) if getattr(config, "direct", False) else config.base_url
    body = {"model": "fake", "messages": [{"role": "user", "content": str(task.instruction)}]}
    auth = {"Authorization": f"Bearer {config.api_key}"}  # the gateway's token (the fake upstream ignores it)
    with rllm.agent_scope("solver"):
        first = requests.post(f"{url}/chat/completions", json=body, timeout=30, headers=auth).json()
    with rllm.agent_scope("critic"), requests.post(f"{url}/chat/completions", json={**body, "stream": True},
                                                   stream=True, timeout=30, headers=auth) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]"
    assert "token_ids" not in first["choices"][0] and "prompt_token_ids" not in first  # stripped again
    return str(first["choices"][0]["message"]["content"])


def test_without_the_plugin_requests_calls_are_not_captured(fake_upstream: FakeUpstream) -> None:
    episode = requests_agent.run({"id": "r", "instruction": "via requests"}, base_url=fake_upstream.base_url,
                                 direct=True)
    assert episode.termination_reason == "completed", episode.error
    assert episode.steps == []  # requests does not go through httpx: this is what the plugin is for


@pytest.mark.parametrize("direct", [True, False], ids=["inprocess", "gateway"])
def test_the_plugin_captures_requests_calls(loaded_plugin: Any, fake_upstream: FakeUpstream, direct: bool) -> None:
    assert "requests" in {spec.name for spec in get_adapters(loaded_plugin)}
    episode = requests_agent.run({"id": "r", "instruction": "via requests"}, base_url=fake_upstream.base_url,
                                 direct=direct)
    assert episode.termination_reason == "completed", episode.error
    assert episode.artifacts["answer"] == "ok: via requests"
    assert trajectory_shape(episode) == [("solver", 1), ("critic", 1)]
    for step in episode.steps:
        assert_wire_exact(fake_upstream, step)


def _ray_listener_rollout(log_path: str, upstream: str) -> rllm.Rollout:
    """A rollout that, in whichever process runs it, registers a listener appending 'pid hook id' to
    `log_path`, then makes one call through the gateway and one straight to `upstream` (captured in-process,
    in the worker); local, so Ray pickles it by value (the test module is not importable in a worker)."""

    def append(line: str) -> None:
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    class FileListener:
        @hookimpl
        def rllm_on_llm_call(self, step: Step) -> None:
            append(f"{os.getpid()} llm_call {step.id}")

        @hookimpl
        def rllm_on_episode_end(self, episode: Episode) -> None:
            append(f"{os.getpid()} episode_end {episode.id}")

    def agent(task: Task, config: rllm.RolloutConfig) -> str:  # uses no global of this module: see above
        import httpx

        from rllm_core.plugins import get_plugin_manager

        pm = get_plugin_manager()
        if not pm.pm.has_plugin("file-listener"):
            pm.register(FileListener(), name="file-listener")
        body = {"model": "m", "messages": [{"role": "user", "content": str(task.instruction)}]}
        httpx.post(f"{upstream}/chat/completions", json=body, timeout=30).raise_for_status()
        resp = httpx.post(f"{config.base_url}/chat/completions", headers={"Authorization": f"Bearer {config.api_key}"},
                          json=body, timeout=30)
        return str(resp.json()["choices"][0]["message"]["content"])

    agent.listener = FileListener  # type: ignore[attr-defined]
    return rllm.rollout(agent, name="ray_listener")


def test_llm_call_once_per_step_in_the_ray_driver_never_in_a_worker(tmp_path, fake_upstream, monkeypatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # before Ray starts: no token auth on a loopback cluster
    ray = pytest.importorskip("ray")
    from rllm_rollout.distributed import connect_ray, run_episodes_ray
    from rllm_rollout.gateway import UpstreamConfig, shared_gateway

    log_path = tmp_path / "events.log"
    ro = _ray_listener_rollout(str(log_path), fake_upstream.base_url)
    pm = get_plugin_manager()
    driver_listener = ro.fn.listener()  # type: ignore[attr-defined]
    pm.register(driver_listener, name="file-listener")
    try:
        with connect_ray(None, num_cpus=2):
            gateway = shared_gateway([UpstreamConfig(url=fake_upstream.base_url)]).remote()
            tasks = [Task(id=f"q{i}", instruction=f"ray {i}") for i in range(3)]
            episodes = asyncio.run(run_episodes_ray(ro, tasks, workers=1, gateway=gateway, model="m",
                                                    progress=False))
    finally:
        pm.pm.unregister(driver_listener)
        if ray.is_initialized():
            ray.shutdown()
    assert [ep.error for ep in episodes] == [None] * 3
    assert [sorted(s.token_source for s in ep.steps) for ep in episodes] == [["server", "server"]] * 3
    events = [line.split() for line in log_path.read_text().splitlines()]
    llm_calls = [(pid, ident) for pid, hook, ident in events if hook == "llm_call"]
    assert sorted(ident for _, ident in llm_calls) == sorted(s.id for ep in episodes for s in ep.steps)
    assert {pid for pid, _ in llm_calls} == {str(os.getpid())}  # the driver sent them; the worker none
    ends = [(pid, ident) for pid, hook, ident in events if hook == "episode_end"]
    assert sorted(ident for _, ident in ends) == sorted(ep.id for ep in episodes)
    assert str(os.getpid()) not in {pid for pid, _ in ends}  # where the agent ran: the worker
