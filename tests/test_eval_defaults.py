"""A benchmark's `eval_defaults` fill the `rllm eval` options the user left unset; a flag always wins. Multi-turn
benchmarks (frozenlake, terminal) recommend a small per-turn token budget, the same for eval and train."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.errors import BenchmarkError, ConfigError
from rllm_core.io import read_jsonl
from rllm_envs.benchmarks import get_benchmark
from rllm_envs.benchmarks.frozenlake import ACTIONS, MOVE_TOKENS, FrozenLake, solve
from rllm_envs.eval.runner import EvalOptions, apply_eval_defaults
from rllm_testing.fake_upstream import start_fake_upstream
from rllm_train.config import TrainConfig
from rllm_train.setup import apply_benchmark_defaults

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))  # no user model config leaks in
    monkeypatch.chdir(tmp_path)


def _planner(body: dict[str, Any]) -> str:
    """Plays the shortest path from where P stands in the latest observation."""
    board = [ln for ln in str(body["messages"][-1]["content"]).splitlines() if ln and set(ln) <= set("SFHGP")]
    path = solve([row.replace("S", "F").replace("P", "S") for row in board]) or [0]
    return f"I will go {ACTIONS[path[0]]}"


def _eval(*args: str) -> Any:
    return runner.invoke(build_app(), ["eval", *args, "--no-progress"], catch_exceptions=False)


def test_defaults_fill_only_what_was_left_unset() -> None:
    lake = get_benchmark("frozenlake")
    opts, applied = apply_eval_defaults(EvalOptions(benchmark="frozenlake", concurrency=4), lake)
    assert applied == {"max_tokens": MOVE_TOKENS} and opts.max_tokens == MOVE_TOKENS and opts.concurrency == 4
    # set explicitly, even to the plain default value: kept
    opts, applied = apply_eval_defaults(EvalOptions(benchmark="frozenlake", max_tokens=512), lake)
    assert applied == {} and opts.max_tokens == 512
    # a benchmark without recommendations changes nothing
    opts, applied = apply_eval_defaults(EvalOptions(benchmark="gsm8k"), get_benchmark("gsm8k"))
    assert applied == {} and opts.max_tokens == 512


def test_unknown_recommendations_are_warned_and_bad_ones_explained(caplog: pytest.LogCaptureFixture) -> None:
    class Odd:
        eval_defaults: ClassVar[dict[str, Any]] = {"max_tokens": 5, "max_tokenz": 7}

    with caplog.at_level(logging.WARNING, logger="rllm.eval"):
        opts, applied = apply_eval_defaults(EvalOptions(benchmark="odd"), Odd())
    assert applied == {"max_tokens": 5} and opts.max_tokens == 5
    assert "recommends unknown eval options ['max_tokenz']; ignored" in caplog.text

    class Bad:
        eval_defaults: ClassVar[dict[str, Any]] = {"concurrency": "many"}

    with pytest.raises(ConfigError, match=r"recommends bad eval options .*pass the option yourself"):
        apply_eval_defaults(EvalOptions(benchmark="bad"), Bad())


def test_rllm_eval_applies_them_says_so_and_a_flag_wins(tmp_path: Path) -> None:
    with start_fake_upstream(_planner) as up:
        res = _eval("frozenlake", "-n", "2", "--base-url", up.base_url, "--model", "fake", "-o", str(tmp_path / "a"))
        assert res.exit_code == 0, res.output
        assert {r["max_tokens"] for r in up.requests} == {MOVE_TOKENS}
        up.requests.clear()
        flagged = _eval("frozenlake", "-n", "2", "--base-url", up.base_url, "--model", "fake", "--max-tokens", "7",
                        "-o", str(tmp_path / "b"))
        assert flagged.exit_code == 0, flagged.output
        assert {r["max_tokens"] for r in up.requests} == {7}
    lines = [ln for ln in res.output.splitlines() if "recommended" in ln]
    assert lines == [f"frozenlake's recommended eval settings: max_tokens={MOVE_TOKENS} (a flag overrides them)"]
    assert "recommended" not in flagged.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["accuracy"] == 1.0 and summary["config"]["max_tokens"] == MOVE_TOKENS
    assert summary["config"]["benchmark_defaults"] == {"max_tokens": MOVE_TOKENS}
    assert "benchmark_defaults" not in json.loads((tmp_path / "b" / "summary.json").read_text())["config"]


def test_max_turns_flag_caps_the_episode_and_shows_in_the_task(tmp_path: Path) -> None:
    with start_fake_upstream(lambda body: "I am not sure") as up:
        res = _eval("frozenlake", "-n", "1", "--base-url", up.base_url, "--model", "fake", "--max-turns", "3",
                    "-o", str(tmp_path / "out"))
        assert res.exit_code == 0, res.output
        assert len(up.requests) == 3
    (ep,) = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    assert ep.task.metadata["max_turns"] == 3 and ep.artifacts["max_turns"] == 3 and ep.artifacts["turns"] == 3
    bad = _eval("frozenlake", "--max-turns", "0", "--base-url", "http://127.0.0.1:9/v1")
    assert bad.exit_code == 2 and "--max-turns must be at least 1" in bad.output


def test_frozenlake_turn_limit_is_visible_and_configurable() -> None:
    assert get_benchmark("frozenlake").max_turns == 16 and get_benchmark("frozenlake-8x8").max_turns == 32
    lake = FrozenLake(4, max_turns=6)
    assert "at most 6 turns" in lake.description
    assert {t.metadata["max_turns"] for t in lake.load("test", max_examples=3)} == {6}
    with pytest.raises(BenchmarkError, match="max_turns must be at least 1"):
        FrozenLake(4, max_turns=0)


@pytest.mark.parametrize("name", ["frozenlake", "frozenlake-8x8", "terminal"])
def test_multi_turn_benchmarks_train_as_they_are_evaluated(name: str) -> None:
    bench = get_benchmark(name)
    assert bench.eval_defaults["max_tokens"] == bench.train_defaults["max_tokens"] < 512
    config, applied = apply_benchmark_defaults(TrainConfig(benchmark=name), bench)
    assert applied["max_tokens"] == config.max_tokens == bench.eval_defaults["max_tokens"]
    config, applied = apply_benchmark_defaults(TrainConfig(benchmark=name, max_tokens=40), bench)
    assert config.max_tokens == 40 and "max_tokens" not in applied
