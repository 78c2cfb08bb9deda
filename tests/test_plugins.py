"""The plugin manager: entry points load, hooks are checked at registration, broken plugins are skipped."""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

import rllm
from rllm.cli.app import build_app
from rllm_core.adapters import AdapterSpec, get_adapters
from rllm_core.errors import PluginError
from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import PluginManager, get_plugin_manager, reset_plugin_manager
from rllm_core.types import Episode, Step, Task
from rllm_train.backend import get_backends


def test_builtins_load_through_entry_points() -> None:
    pm = PluginManager()
    loaded = {i.name: i for i in pm.infos if i.error is None}
    assert "core" in loaded and loaded["core"].kinds == ["command"]
    assert loaded["core"].version == "0.1.0"


def test_register_checks_hooks_at_registration() -> None:
    pm = PluginManager(load_entry_points=False)
    bad = types.SimpleNamespace()

    @hookimpl
    def rllm_register_adapters(unknown_arg):  # wrong signature
        return []

    bad.rllm_register_adapters = rllm_register_adapters
    with pytest.raises(PluginError, match="does not match rllm's hook specs"):
        pm.register(bad, name="bad")
    assert not pm.pm.has_plugin("bad")


def test_register_and_collect() -> None:
    pm = PluginManager(load_entry_points=False)

    class Mine:
        @hookimpl
        def rllm_register_adapters(self):
            return [AdapterSpec(name="mine", module="mine", framework="mine")]

    pm.register(Mine(), name="mine", version="1.2")
    assert [a.name for a in get_adapters(pm)] == ["mine"]
    assert pm.infos[-1].kinds == ["adapter"] and pm.infos[-1].version == "1.2"


def test_event_hook_errors_are_logged_not_raised(caplog) -> None:
    """One plugin raising in an event hook is logged; the plugins called before and after it still run.
    (Order is pluggy's: the most recently registered first.)"""
    pm = PluginManager(load_entry_points=False)
    seen: list[str] = []

    class Broken:
        @hookimpl
        def rllm_on_llm_call(self, step):
            raise RuntimeError("plugin bug")

    class Good:
        @hookimpl
        def rllm_on_llm_call(self, step):
            seen.append(step.id)

    class Counter:  # pluggy lets an implementation take fewer arguments than its spec
        @hookimpl
        def rllm_on_llm_call(self):
            seen.append("counted")

    pm.register(Good(), name="good")
    pm.register(Broken(), name="broken")
    pm.register(Counter(), name="counter")
    pm.emit("rllm_on_episode_end", episode=Episode(task=Task(id="t")))  # nobody implements it: a no-op
    pm.emit("rllm_on_llm_call", step=Step(id="s1"))
    assert seen == ["counted", "s1"]  # counter (last registered) first, broken in between, good last
    assert "plugin bug" in caplog.text and "'broken' failed in rllm_on_llm_call" in caplog.text
    assert all(i.error is None for i in pm.infos)  # an event failure is a log line, not a broken plugin


def test_failed_plugin_reported_and_cli_still_works(monkeypatch) -> None:
    import importlib.metadata as md

    real = md.entry_points

    def fake_entry_points(group: str):
        eps = list(real(group=group))
        eps.append(md.EntryPoint(name="zz_broken", value="no_such_module_xyz", group=group))
        return eps

    monkeypatch.setattr("rllm_core.plugins.entry_points", fake_entry_points)
    reset_plugin_manager()
    try:
        pm = get_plugin_manager()
        broken = [i for i in pm.infos if i.name == "zz_broken"]
        assert broken and "No module named 'no_such_module_xyz'" in (broken[0].error or "")
        result = CliRunner().invoke(build_app(), ["plugins", "--json"])
        assert result.exit_code == 0, result.output
        assert "zz_broken" in result.output and "no_such_module_xyz" in result.output
    finally:
        reset_plugin_manager()


def test_loading_all_plugins_stays_light() -> None:
    """`rllm --help` and the gateway load every plugin: none of them may import torch (seconds) or the
    gateway's aiohttp server (~0.3 s) at load time."""
    import subprocess
    import sys

    code = ("import sys; from rllm_core.plugins import get_plugin_manager; pm = get_plugin_manager(); "
            "print([i.name for i in pm.infos if i.error]); print('torch' in sys.modules, 'aiohttp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    failed, heavy_loaded = out.stdout.strip().splitlines()
    assert failed == "[]", out.stdout + out.stderr
    assert heavy_loaded == "False False"


def test_plugin_with_hooks_that_do_not_match_is_reported_and_skipped(monkeypatch) -> None:
    """An entry point that imports fine but whose hooks are wrong must not take the manager (or CLI) down."""
    import importlib.metadata as md
    import sys

    bad = types.ModuleType("rllm_test_bad_hooks")

    @hookimpl
    def rllm_register_backends(config):  # the spec takes no argument
        return []

    bad.rllm_register_backends = rllm_register_backends
    monkeypatch.setitem(sys.modules, "rllm_test_bad_hooks", bad)
    real = md.entry_points
    monkeypatch.setattr("rllm_core.plugins.entry_points", lambda group: [
        *real(group=group), md.EntryPoint(name="zz_bad_hooks", value="rllm_test_bad_hooks", group=group)])
    pm = PluginManager()
    [info] = [i for i in pm.infos if i.name == "zz_bad_hooks"]
    assert "does not match rllm's hook specs" in (info.error or "")
    assert not pm.pm.has_plugin("zz_bad_hooks")
    assert "local" in get_backends(pm)  # the others still load


def test_registration_hook_that_raises_is_reported_not_fatal(caplog) -> None:
    pm = PluginManager(load_entry_points=False)

    class Crashes:
        @hookimpl
        def rllm_register_adapters(self):
            raise RuntimeError("optional dependency missing")

    class Fine:
        @hookimpl
        def rllm_register_adapters(self):
            return [AdapterSpec(name="fine", module="fine", framework="fine")]

    pm.register(Fine(), name="fine")
    pm.register(Crashes(), name="crashes")
    assert [a.name for a in get_adapters(pm)] == ["fine"]
    [info] = [i for i in pm.infos if i.name == "crashes"]
    assert info.error == "rllm_register_adapters: RuntimeError: optional dependency missing"
    assert "optional dependency missing" in caplog.text


def test_same_name_twice_is_a_clear_error() -> None:
    pm = PluginManager(load_entry_points=False)
    pm.register(types.SimpleNamespace(), name="one")
    with pytest.raises(PluginError, match="already registered"):
        pm.register(types.SimpleNamespace(), name="one")


@pytest.mark.parametrize("message", ["the --flag is wrong; pass --flag 3",
                                     "Parquet needs pyarrow: pip install 'rllm[parquet]'"])  # rich keeps [parquet]
def test_cli_prints_rllm_errors_as_one_line(monkeypatch, capsys, message: str) -> None:
    """A command that raises an RLLMError exits 2 with its message, never a traceback (and markup-like text such as
    an `rllm[extra]` hint printed as written)."""
    import sys

    from rllm.cli import main
    from rllm_core.errors import ConfigError

    class Boom:
        @hookimpl
        def rllm_register_commands(self, app):
            @app.command("boom")
            def boom() -> None:
                raise ConfigError(message)

    reset_plugin_manager()
    try:
        get_plugin_manager().register(Boom(), name="boom")
        monkeypatch.setattr(sys, "argv", ["rllm", "boom"])
        with pytest.raises(SystemExit) as exit_info:
            main()
    finally:
        reset_plugin_manager()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"rllm: {message}" in err and "Traceback" not in err


def test_adapter_status_reports_install_and_range() -> None:
    from rllm.cli.plugins_cmd import adapter_status

    assert adapter_status(AdapterSpec("x", "x", framework="no-such-dist-xyz", extra="x")) == (
        None, 'not installed (pip install "rllm[x]")')
    installed, status = adapter_status(AdapterSpec("p", "p", framework="pluggy", tested_versions=">=1.0"))
    assert installed and status == "ok"
    _, status = adapter_status(AdapterSpec("p", "p", framework="pluggy", tested_versions="<0.1"))
    assert status == "untested version (tested: <0.1)"
    result = CliRunner().invoke(build_app(), ["plugins"])
    assert result.exit_code == 0 and "framework adapters" in result.output and "langgraph" in result.output


def test_misspelt_hook_names_the_real_one() -> None:
    pm = PluginManager(load_entry_points=False)
    typo = types.SimpleNamespace()

    @hookimpl
    def rllm_register_adaptors():  # one letter off rllm_register_adapters
        return []

    typo.rllm_register_adaptors = rllm_register_adaptors
    with pytest.raises(PluginError) as info:
        pm.register(typo, name="typo")
    text = str(info.value)
    assert "unknown hook 'rllm_register_adaptors' (did you mean rllm_register_adapters?)" in text
    assert "\n" not in text and "namespace(" not in text  # one line, without the plugin object's repr


# ------------------------------------------------------------------ pluggy's own order, wrappers and tracing
def _named(name: str, **marks: bool) -> object:
    """A plugin whose adapter hook returns [name] and whose event hook appends name to `calls`."""

    class Plugin:
        @hookimpl(**marks)
        def rllm_register_adapters(self):
            return [name]

        @hookimpl(**marks)
        def rllm_on_llm_call(self, step):
            step.metadata.setdefault("calls", []).append(name)

    return Plugin()


def test_order_is_pluggys_tryfirst_then_last_registered_then_trylast() -> None:
    pm = PluginManager(load_entry_points=False)
    pm.register(_named("last", trylast=True), name="last")
    pm.register(_named("a"), name="a")
    pm.register(_named("first", tryfirst=True), name="first")
    pm.register(_named("b"), name="b")
    assert pm.call_each("rllm_register_adapters") == [["first"], ["b"], ["a"], ["last"]]
    step = Step(id="s")
    pm.emit("rllm_on_llm_call", step=step)
    assert step.metadata["calls"] == ["first", "b", "a", "last"]


def test_backend_name_clash_goes_to_the_first_called() -> None:
    from rllm_train.backend import BackendSpec

    def plugin(label: str, **marks: bool) -> object:
        class Backends:
            @hookimpl(**marks)
            def rllm_register_backends(self):
                return [BackendSpec(name="x", factory=lambda config: None, description=label)]

        return Backends()

    pm = PluginManager(load_entry_points=False)
    pm.register(plugin("builtin"), name="builtin")
    pm.register(plugin("override"), name="override")
    assert get_backends(pm)["x"].description == "override"  # registered later: called first, as pluggy does
    pm.register(plugin("preferred", tryfirst=True), name="preferred")
    assert get_backends(pm)["x"].description == "preferred"


def test_new_style_wrapper_wraps_the_call_and_may_change_the_result() -> None:
    pm = PluginManager(load_entry_points=False)
    order: list[str] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def rllm_register_adapters(self):
            order.append("before")
            result = yield
            order.append(f"after {result}")
            return [*result, ["added by wrapper"]]

        @hookimpl(wrapper=True)
        def rllm_on_llm_call(self, step):
            order.append(f"around {step.id}")
            yield
            order.append(f"saw {step.metadata['calls']}")

    pm.register(_named("inner"), name="inner")
    pm.register(Wrapper(), name="wrapper")
    assert pm.call_each("rllm_register_adapters") == [["inner"], ["added by wrapper"]]
    pm.emit("rllm_on_llm_call", step=Step(id="s"))
    assert order == ["before", "after [['inner']]", "around s", "saw ['inner']"]


@pytest.mark.parametrize("where", ["before_yield", "after_yield", "no_yield", "two_yields"])
def test_a_broken_wrapper_is_reported_and_the_call_goes_on(where: str, caplog) -> None:
    pm = PluginManager(load_entry_points=False)

    class Bad:
        @hookimpl(wrapper=True)
        def rllm_register_adapters(self):
            if where == "before_yield":
                raise RuntimeError("wrapper bug")
            if where == "no_yield":
                return []
            result = yield
            if where == "two_yields":
                yield
            raise RuntimeError("wrapper bug")
            return result  # unreachable, keeps it a generator with a result

    pm.register(_named("inner"), name="inner")
    pm.register(Bad(), name="bad")
    assert pm.call_each("rllm_register_adapters") == [["inner"]]  # as if the wrapper were not there
    [bad] = [i for i in pm.infos if i.name == "bad"]
    expected = {"before_yield": "RuntimeError: wrapper bug", "after_yield": "RuntimeError: wrapper bug",
                "no_yield": "StopIteration", "two_yields": "must yield exactly once"}[where]
    assert bad.error is not None and bad.error.startswith("rllm_register_adapters: ") and expected in bad.error


def test_old_style_hookwrapper_is_refused_at_registration() -> None:
    pm = PluginManager(load_entry_points=False)

    class Legacy:
        @hookimpl(hookwrapper=True)
        def rllm_on_llm_call(self, step):
            yield

    with pytest.raises(PluginError, match=r"rllm_on_llm_call uses the old-style .*hookwrapper=True.*wrapper=True"):
        pm.register(Legacy(), name="legacy")
    assert not pm.pm.has_plugin("legacy")
    pm.emit("rllm_on_llm_call", step=Step(id="s"))  # the manager is left as it was


def test_calls_go_through_pluggys_tracing_and_monitoring() -> None:
    pm = PluginManager(load_entry_points=False)
    pm.register(_named("a"), name="a")
    lines: list[str] = []
    pm.pm.trace.root.setwriter(lines.append)
    undo_trace = pm.pm.enable_tracing()
    monitored: list[tuple[str, list[str]]] = []
    undo_monitor = pm.pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: monitored.append((name, [i.plugin_name for i in impls])),
        lambda outcome, name, impls, kwargs: monitored.append((name, [repr(outcome.get_result())])))
    try:
        pm.emit("rllm_on_llm_call", step=Step(id="s"))
        get_adapters(pm)
    finally:
        undo_monitor()
        undo_trace()
    text = "".join(lines)
    assert "rllm_on_llm_call [hook]" in text and "finish rllm_on_llm_call --> [] [hook]" in text
    assert "finish rllm_register_adapters --> [['a']] [hook]" in text
    assert monitored == [("rllm_on_llm_call", ["a"]), ("rllm_on_llm_call", ["[]"]),
                         ("rllm_register_adapters", ["a"]), ("rllm_register_adapters", ["[['a']]"])]


def test_unknown_hook_name_is_a_clear_error() -> None:
    pm = PluginManager(load_entry_points=False)
    with pytest.raises(PluginError, match=r"no rllm hook named 'rllm_on_llm_calls' \(did you mean rllm_on_llm_call"):
        pm.emit("rllm_on_llm_calls", step=Step(id="s"))


# ------------------------------------------------------------------ rllm_on_llm_call: once per Step, in the driver
class _Listener:
    """Records each event in order, with the thread it ran on: the driver's run where the caller awaits."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.episodes: list[str] = []
        self.order: list[str] = []

    @hookimpl
    def rllm_on_llm_call(self, step: Step) -> None:
        self.calls.append((step.id, threading.get_ident()))
        self.order.append(step.id)

    @hookimpl
    def rllm_on_episode_end(self, episode: Episode) -> None:
        self.episodes.append(episode.id)
        self.order.append(episode.id)


@pytest.fixture
def listener() -> Iterator[_Listener]:
    pm = get_plugin_manager()
    found = _Listener()
    pm.register(found, name="test-step-listener")
    try:
        yield found
    finally:
        pm.pm.unregister(found)


def _chat(base_url: str, api_key: str, text: str) -> str:
    resp = httpx.post(f"{base_url}/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                      json={"model": "m", "messages": [{"role": "user", "content": text}]}, timeout=30)
    resp.raise_for_status()
    return str(resp.json()["choices"][0]["message"]["content"])


def _assert_once_each_on_this_thread(listener: _Listener, episodes: list[Episode]) -> None:
    ids = [s.id for ep in episodes for s in ep.steps]
    assert ids and sorted(i for i, _ in listener.calls) == sorted(ids)  # each Step once, none twice
    assert {thread for _, thread in listener.calls} == {threading.get_ident()}
    assert sorted(listener.episodes) == sorted(ep.id for ep in episodes)
    for ep in episodes:  # each episode's end first, then its steps: as in a Ray driver, where the worker ended it
        assert all(listener.order.index(ep.id) < listener.order.index(s.id) for s in ep.steps)


@rllm.rollout
def _two_gateway_calls(task: Task, config: rllm.RolloutConfig) -> str:
    _chat(config.base_url, config.api_key, "one")
    return _chat(config.base_url, config.api_key, "two")


def test_llm_call_once_per_step_through_the_in_process_gateway(listener: _Listener, fake_upstream) -> None:
    from rllm_rollout.engine import run_episodes

    tasks = [Task(id=f"t{i}") for i in range(3)]
    episodes = asyncio.run(run_episodes(_two_gateway_calls, tasks, base_url=fake_upstream.base_url,
                                        concurrency=3, progress=False))
    assert [len(ep.steps) for ep in episodes] == [2, 2, 2]
    _assert_once_each_on_this_thread(listener, episodes)


def test_llm_call_once_per_step_through_a_remote_gateway(listener: _Listener, fake_upstream) -> None:
    """A gateway reached as a RemoteGateway (as from a Ray worker) sends nothing itself: its loop runs on
    another thread here, and every event must come from the driver's side."""
    from rllm_rollout.gateway import UpstreamConfig, start_gateway

    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)]) as gw:
        remote = gw.remote()
        try:
            episode = _two_gateway_calls.run(Task(id="r"), gateway=remote, model="m")
        finally:
            remote.close()
        _chat(gw.session_base_url("outside"), gw.client_api_key or "", "no episode")  # recorded, never sent
        assert len(gw.take_steps("outside")) == 1
    assert episode.error is None and len(episode.steps) == 2
    _assert_once_each_on_this_thread(listener, [episode])


def test_llm_call_once_per_step_captured_in_process(listener: _Listener, fake_upstream) -> None:
    @rllm.rollout
    def direct(task: Task, config: rllm.RolloutConfig) -> None:
        assert config.upstream_url is not None
        _chat(config.upstream_url, "x", "direct")  # not through the gateway: in-process capture records it

    episode = direct.run(Task(id="d"), base_url=fake_upstream.base_url)
    assert [s.messages[0]["content"] for s in episode.steps] == ["direct"]
    _assert_once_each_on_this_thread(listener, [episode])


def test_llm_call_once_per_step_of_an_adapters_ad_hoc_episode(listener: _Listener, fake_upstream) -> None:
    """Calls outside @rllm.rollout, recorded by an adapter under an ad-hoc episode, reach plugins when the
    adapter finishes that episode (in this process: the driver)."""
    import warnings

    from rllm_adapters import finish_adhoc_episode, open_adhoc_episode
    from rllm_core.context import episode_scope

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the adapter's once-per-process "outside @rllm.rollout" warning
        ctx = open_adhoc_episode("test")
    with episode_scope(ctx):
        _chat(fake_upstream.base_url, "x", "ad hoc")
    episode = finish_adhoc_episode(ctx, "adhoc-agent")
    assert len(episode.steps) == 1 and listener.calls[0][0] == episode.steps[0].id and len(listener.calls) == 1
