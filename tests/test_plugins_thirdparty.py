"""A third-party plugin, installed the way a user would: `rllm plugins` lists it and its capture works.

The example package (examples/plugins/rllm-requests-adapter) is pip-installed into a temporary target
directory, not into the shared venv, and put on sys.path / PYTHONPATH, where entry points are found.
"""

from __future__ import annotations

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
from rllm_core.plugins import get_plugin_manager, reset_plugin_manager
from rllm_core.testing.fake_upstream import FakeUpstream

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
    with rllm.agent_scope("solver"):
        first = requests.post(f"{url}/chat/completions", json=body, timeout=30).json()
    with rllm.agent_scope("critic"), requests.post(f"{url}/chat/completions", json={**body, "stream": True},
                                                   stream=True, timeout=30) as resp:
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
    assert "requests" in {spec.name for spec in loaded_plugin.adapters()}
    episode = requests_agent.run({"id": "r", "instruction": "via requests"}, base_url=fake_upstream.base_url,
                                 direct=direct)
    assert episode.termination_reason == "completed", episode.error
    assert episode.artifacts["answer"] == "ok: via requests"
    assert trajectory_shape(episode) == [("solver", 1), ("critic", 1)]
    for step in episode.steps:
        assert_wire_exact(fake_upstream, step)
