"""Shared checks for the adapter tests (imported by them), and tests of what all adapters share.

`assert_wire_exact` is the per-call check every adapter test makes: a Step's token ids and logprobs are
exactly what the fake upstream sent for the request it answered (found by the response id).
"""

from __future__ import annotations

import json
import sys
import warnings
from importlib.metadata import version

import pluggy
import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rllm_adapters._common import (
    AdapterWarning,
    CallRecord,
    check_version,
    fingerprint,
    finish_adhoc_episode,
    join_records,
    lazy_exports,
    open_adhoc_episode,
    require_framework,
    reset_warnings,
)
from rllm_core.adapters import get_adapters
from rllm_core.plugins import PluginManager
from rllm_core.types import Episode, Step
from rllm_testing.fake_upstream import FakeUpstream, default_responder, encode, token_logprob

ADAPTERS = ["autogen", "langchain", "langgraph", "openai_agents", "openai_sdk"]


# ------------------------------------------------------------------------------------------ helpers
def expected_reply_ids(up: FakeUpstream, body: dict) -> list[int]:
    reply = up.responder(body) if up.responder is not default_responder else default_responder(body)
    if isinstance(reply, dict) and "tool_call" in reply:
        return encode(json.dumps(reply["tool_call"].get("arguments", {})))
    return encode(str(reply))


def assert_wire_exact(up: FakeUpstream, step: Step) -> None:
    """The Step holds the server's own prompt ids, completion ids and logprobs for its request."""
    rid = step.metadata.get("response_id")
    assert rid and rid.startswith("cmpl-"), f"step has no response id: {step.metadata}"
    body = up.requests[int(rid.split("-")[1]) - 1]
    ids = expected_reply_ids(up, body)
    assert step.error is None, step.error
    assert step.token_source == "server"
    assert step.completion_token_ids == ids
    assert step.logprobs == [token_logprob(t) for t in ids]
    if "messages" in body:
        prompt = encode(json.dumps(body["messages"], sort_keys=True, separators=(",", ":")))
    else:
        prompt = encode(str(body["prompt"]))
    assert step.prompt_token_ids == prompt
    assert step.trainable


def trajectory_shape(episode: Episode) -> list[tuple[str, int]]:
    """(name, number of steps) per trajectory, in the episode's order."""
    return [(t.name, len(t.steps)) for t in episode.trajectories]


def episode_text(episode: Episode) -> str:
    """Everything the episode's calls were prompted with, to check no call strayed into another episode."""
    return " ".join(json.dumps(s.messages) for s in episode.steps)


@pytest.fixture(autouse=True)
def fresh_warnings() -> None:
    reset_warnings()


# --------------------------------------------------------------------------------------------- tests
def test_adapter_without_its_framework_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import rllm_adapters.autogen
    import rllm_adapters.langgraph

    monkeypatch.setitem(sys.modules, "langgraph", None)  # what Python does for a package that is not installed
    monkeypatch.setitem(sys.modules, "autogen_agentchat", None)
    with pytest.raises(ImportError, match=r'rllm_adapters.langgraph needs .*pip install "rllm\[langgraph\]"'):
        from rllm_adapters.langgraph import RLLMCallbackHandler  # noqa: F401
    with pytest.raises(ImportError, match=r'pip install "rllm\[autogen\]"'):
        rllm_adapters.autogen.wrap_team  # noqa: B018
    assert rllm_adapters.langgraph.TESTED_VERSIONS  # the package itself (and its plugin) still imports


def test_missing_framework_names_the_extra() -> None:
    with pytest.raises(ImportError, match=r'pip install "rllm\[langgraph\]"'):
        require_framework("rllm_no_such_framework", extra="langgraph", adapter="langgraph")
    getter = lazy_exports({"Thing": "rllm_no_such_framework.x"}, framework="rllm_no_such_framework",
                          dist="nope", tested=">=1", extra="autogen", adapter="autogen")
    with pytest.raises(ImportError, match=r"rllm\[autogen\]"):
        getter("Thing")
    with pytest.raises(AttributeError):
        getter("Other")


def test_version_outside_tested_range_warns_with_the_range() -> None:
    with pytest.warns(AdapterWarning, match=r"pluggy.*outside the range.*pluggy<0\.1"):
        assert not check_version("pluggy", "<0.1", adapter="example")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_version("pydantic", ">=2", adapter="example")
        assert check_version("pluggy", "<0.1", adapter="example") is False  # warned once only


def test_adapter_names_warn_once_when_the_framework_is_outside_the_range() -> None:
    """The path an adapter import takes: the first name resolved checks the version, later ones do not."""
    getter = lazy_exports({"PluginManager": "pluggy", "HookimplMarker": "pluggy"}, framework="pluggy",
                          dist="pluggy", tested=">=0.1,<0.2", extra="example", adapter="example")
    with pytest.warns(AdapterWarning, match=r"pluggy 1\..* outside the range rllm_adapters.example was tested"
                                            r".*pip install \"pluggy>=0.1,<0.2\""):
        assert getter("PluginManager") is pluggy.PluginManager
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getter("HookimplMarker") is not None


def test_installed_frameworks_are_inside_the_tested_ranges() -> None:
    """The ranges the warnings name are the versions CI runs these tests with, not wishes."""
    for spec in get_adapters(PluginManager()):
        if spec.name in ADAPTERS:
            assert spec.tested_versions and Version(version(spec.framework)) in SpecifierSet(spec.tested_versions), (
                f"{spec.framework} {version(spec.framework)} is not in {spec.name}'s tested range "
                f"{spec.tested_versions}: update TESTED_VERSIONS in rllm_adapters/{spec.name}/plugin.py")


def test_adhoc_episode_never_raises_even_when_warnings_are_errors(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. pytest's filterwarnings = error in the user's project
        ctx = open_adhoc_episode("example")
    assert ctx.adhoc and ctx.session_id.startswith("adhoc-")
    assert "outside an @rllm.rollout" in caplog.text
    episode = finish_adhoc_episode(ctx, "example")
    assert episode.id == ctx.session_id and episode.termination_reason == "completed" and episode.steps == []


def test_join_prefers_response_id_then_fingerprint_in_order() -> None:
    msgs_a = [{"role": "user", "content": "a"}]
    msgs_b = [{"role": "user", "content": "b"}]
    s1 = Step(messages=msgs_a, agent="x", metadata={"response_id": "r1"}, started_at=1)
    s2 = Step(messages=msgs_b, agent="x", metadata={"response_id": "r2"}, started_at=2)
    s3 = Step(messages=msgs_a, agent="y", started_at=3)
    recs = [
        CallRecord(framework="f", agent="x", fingerprint=fingerprint(msgs_a), response_id="r2",
                   metadata={"n": 2}, started_at=1),  # the id wins over the (wrong) fingerprint
        CallRecord(framework="f", agent="y", fingerprint=fingerprint(msgs_a), metadata={"n": 3}, started_at=2),
        CallRecord(framework="f", agent="x", fingerprint=fingerprint(msgs_b), metadata={"n": 9}, started_at=3),
    ]
    assert join_records([s1, s2, s3], recs) == 2
    assert s2.metadata["n"] == 2 and s3.metadata["n"] == 3
    assert "framework" not in s1.metadata  # fingerprint b does not match prompt a: left alone


def test_adapter_plugins_register_without_importing_frameworks() -> None:
    pm = PluginManager()
    infos = {i.name: i for i in pm.infos}
    for name in ADAPTERS:
        assert name in infos and infos[name].error is None, infos.get(name)
        assert "adapter" in infos[name].kinds
    specs = {s.name: s for s in get_adapters(pm)}
    assert set(ADAPTERS) <= set(specs)
    assert specs["autogen"].extra == "autogen" and specs["autogen"].tested_versions == ">=0.7,<0.8"


def test_public_surface_is_pinned() -> None:
    import rllm_adapters.autogen as ag
    import rllm_adapters.langchain as lc
    import rllm_adapters.langgraph as lg
    import rllm_adapters.openai_agents as oa
    import rllm_adapters.openai_sdk as sdk

    assert lc.__all__ == ["TESTED_VERSIONS", "RLLMCallbackHandler", "SplitBy", "install", "installed_handler",
                          "uninstall"]
    assert lg.__all__ == ["TESTED_VERSIONS", "RLLMCallbackHandler", "install", "uninstall", "wrap_graph"]
    assert ag.__all__ == ["TESTED_VERSIONS", "EpisodeBinding", "NamedModelClient", "adhoc_episodes",
                          "named_clients", "wrap_team"]
    assert sdk.__all__ == ["AGENT_HEADER", "TESTED_VERSIONS", "agent_of", "wrap_client"]
    assert oa.__all__ == ["TESTED_VERSIONS", "RLLMTracingProcessor", "install", "installed_processor",
                          "run_config"]
    for mod in (ag, lc, lg, oa, sdk):
        for name in mod.__all__:
            assert getattr(mod, name) is not None
    assert lg.RLLMCallbackHandler is lc.RLLMCallbackHandler
    import rllm_adapters

    assert rllm_adapters.__all__ == ["AdapterWarning", "CallRecord", "call_log", "check_version", "enter_scopes",
                                     "finish_adhoc_episode", "open_adhoc_episode", "require_framework"]
    assert rllm_adapters.AdapterWarning is AdapterWarning
