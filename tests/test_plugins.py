"""The plugin manager: entry points load, hooks are checked at registration, broken plugins are skipped."""

from __future__ import annotations

import types

import pytest
from typer.testing import CliRunner

from rllm_core.cli.app import build_app
from rllm_core.errors import PluginError
from rllm_core.hookspecs import hookimpl
from rllm_core.plugins import AdapterSpec, PluginManager, get_plugin_manager, reset_plugin_manager
from rllm_core.types import Episode, Step, Task


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
    assert [a.name for a in pm.adapters()] == ["mine"]
    assert pm.infos[-1].kinds == ["adapter"] and pm.infos[-1].version == "1.2"


def test_event_hook_errors_are_logged_not_raised(caplog) -> None:
    pm = PluginManager(load_entry_points=False)
    seen: list[str] = []

    class Broken:
        @hookimpl
        def rllm_on_episode_end(self, episode):
            raise RuntimeError("plugin bug")

    class Good:
        @hookimpl
        def rllm_on_llm_call(self, step):
            seen.append(step.id)

    class Counter:  # pluggy lets an implementation take fewer arguments than its spec
        @hookimpl
        def rllm_on_llm_call(self):
            seen.append("counted")

    pm.register(Broken(), name="broken")
    pm.register(Good(), name="good")
    pm.register(Counter(), name="counter")
    pm.emit("rllm_on_episode_end", episode=Episode(task=Task(id="t")))
    pm.emit("rllm_on_llm_call", step=Step(id="s1"))
    assert seen == ["s1", "counted"]
    assert "plugin bug" in caplog.text


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
    assert "local" in pm.backends()  # the others still load


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
    assert [a.name for a in pm.adapters()] == ["fine"]
    [info] = [i for i in pm.infos if i.name == "crashes"]
    assert info.error == "rllm_register_adapters: RuntimeError: optional dependency missing"
    assert "optional dependency missing" in caplog.text


def test_same_name_twice_is_a_clear_error() -> None:
    pm = PluginManager(load_entry_points=False)
    pm.register(types.SimpleNamespace(), name="one")
    with pytest.raises(PluginError, match="already registered"):
        pm.register(types.SimpleNamespace(), name="one")


def test_cli_prints_rllm_errors_as_one_line(monkeypatch, capsys) -> None:
    """A command that raises an RLLMError exits 2 with its message, never a traceback."""
    import sys

    from rllm_core.cli import main
    from rllm_core.errors import ConfigError

    class Boom:
        @hookimpl
        def rllm_register_commands(self, app):
            @app.command("boom")
            def boom() -> None:
                raise ConfigError("the --flag is wrong; pass --flag 3")

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
    assert "rllm: the --flag is wrong; pass --flag 3" in err and "Traceback" not in err


def test_adapter_status_reports_install_and_range() -> None:
    from rllm_core.cli.plugins_cmd import adapter_status

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
