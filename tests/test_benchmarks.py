"""Every offline benchmark loads rows and grades its gold answer 1.0 and a wrong one 0.0; bad input is explained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rllm_core.errors import BenchmarkError
from rllm_core.types import Episode, Step, Task, Trajectory
from rllm_envs.benchmarks import Benchmark, get_benchmark, list_benchmarks

FILE_SETS = ["gsm8k", "math500", "aime24", "amc23", "minerva_math", "olympiadbench", "svamp", "asdiv", "mawps"]


@pytest.fixture(autouse=True)
def _data_dir(shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_DATA_DIR", str(shared_data_dir))


def _offline_names() -> list[str]:
    import os

    from conftest import SHARED_DATA  # not `tests.conftest`: verl's wheel installs a top-level `tests` package

    os.environ.setdefault("RLLM_DATA_DIR", str(SHARED_DATA))
    # verifier benchmarks (terminal, harbor:PATH) grade the sandbox's end state, not a response text: their
    # oracle / do-nothing check is tests/test_terminal_tasks.py
    return [b.name for b in list_benchmarks() if b.offline and b.reward != "verifier"]


def _wrong(bench: Benchmark, task: Task) -> str:
    if bench.reward == "multiple_choice":
        return "The answer is (A)." if task.ground_truth != "A" else "The answer is (B)."
    if bench.category == "code":
        return "```python\ndef nothing():\n    return None\n```"
    if bench.name.startswith("frozenlake"):
        return "UP"  # from the start (top-left) UP is a wall: never reaches the goal
    if bench.reward == "reasoning_gym":
        return "<answer>zzz not it</answer>"
    if bench.name == "geometry-shapes":  # a word answer: another shape's name
        return "A triangle." if task.ground_truth != "triangle" else "A circle."
    return "The answer is \\boxed{-987654.321}."


def test_registry_counts() -> None:
    benches = list_benchmarks()
    assert len(benches) >= 60
    assert sum(b.offline for b in benches) >= 15
    names = {b.name for b in benches}
    assert {"gsm8k", "humaneval", "frozenlake", "countdown", "basic_arithmetic", "arithmetic",
            "arithmetic-2digit", "mmlu_pro", "gpqa_diamond", "mbpp", "livecodebench", "finqa"} <= names
    for b in benches:
        info = b.info()
        assert {"name", "category", "rows", "reward", "offline"} <= set(info)


@pytest.mark.parametrize("name", _offline_names())
def test_offline_benchmark_gold_and_wrong(name: str) -> None:
    bench = get_benchmark(name)
    tasks = bench.load(split="test", max_examples=2)
    assert len(tasks) == 2
    for task in tasks:
        assert task.instruction and task.benchmark == name
        gold = bench.grade(task, bench.reference_response(task))
        assert (gold.reward, gold.reason, gold.is_correct) == (1.0, "correct", True), (task.id, gold)
        wrong = bench.grade(task, _wrong(bench, task))
        assert wrong.reward == 0.0 and not wrong.is_correct, (task.id, wrong)
        # reasoning-gym scorers that cannot parse "zzz not it" raise: that is a format error, not a wrong value
        expected = ("wrong_answer", "format_error") if bench.reward == "reasoning_gym" else ("wrong_answer",)
        assert wrong.reason in expected, wrong
        assert Task.model_validate_json(task.model_dump_json()) == task  # tasks round-trip through JSONL


def test_file_sets_are_offline_and_sized(shared_data_dir: Path) -> None:
    for name in FILE_SETS:
        bench = get_benchmark(name)
        assert bench.offline
        assert bench.rows("test") == len((shared_data_dir / name / "test.jsonl").read_text().splitlines())
    assert get_benchmark("gsm8k").rows("train") == 7473
    gold = get_benchmark("gsm8k").load(max_examples=1)[0].ground_truth
    assert gold == "18"


def test_unknown_benchmark_suggests_close_names() -> None:
    with pytest.raises(BenchmarkError, match=r"gsm8k") as err:
        get_benchmark("gsm8")
    assert "rllm bench list" in str(err.value)
    assert get_benchmark("GSM8K").name == "gsm8k"


def test_missing_file_and_bad_fields(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n"
                                                   + json.dumps({"prompt": "2+2?", "answer": "#### 4"}) + "\n")
    with pytest.raises(BenchmarkError) as err:
        get_benchmark("gsm8k").load(data_dir=str(tmp_path))
    msg = str(err.value)
    assert "test.jsonl:2" in msg and "'question'" in msg and "prompt" in msg
    with pytest.raises(BenchmarkError, match="does not exist"):
        get_benchmark("gsm8k").load(data_dir=str(tmp_path / "nope"))
    with pytest.raises(BenchmarkError, match="no split 'validation'"):
        get_benchmark("gsm8k").load(split="validation")


def test_hub_only_offline_names_dataset_and_local_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("RLLM_DATA_DIR", str(tmp_path))
    bench = get_benchmark("mmlu_pro")
    assert not bench.offline
    with pytest.raises(BenchmarkError) as err:
        bench.load(max_examples=2)
    msg = str(err.value)
    assert "TIGER-Lab/MMLU-Pro" in msg and "mmlu_pro/test.jsonl" in msg and "RLLM_DATA_DIR" in msg
    # The same entry runs from local files in the documented layout.
    (tmp_path / "mmlu_pro").mkdir()
    row = {"question": "2+2?", "options": ["3", "4", "5"], "answer": "B"}
    (tmp_path / "mmlu_pro" / "test.jsonl").write_text(json.dumps(row) + "\n")
    task = bench.load()[0]
    assert "B) 4" in str(task.instruction)
    assert bench.grade(task, "The answer is (B)").is_correct
    assert bench.grade(task, "no letter here").reason == "no_answer_extracted"


def test_arithmetic_levels_and_disjoint_splits() -> None:
    bench = get_benchmark("arithmetic")
    train, test = bench.load("train"), bench.load("test")
    assert len(train) + len(test) == 100
    assert not {t.instruction for t in train} & {t.instruction for t in test}
    assert test[0].instruction.startswith("What is ") and test[0].instruction.endswith("Answer with just the number.")
    assert bench.load("test", seed=1) != bench.load("test", seed=2)
    first = test[0]
    assert bench.grade(first, f"{first.metadata['a']} + {first.metadata['b']} = {first.ground_truth}").is_correct
    two = get_benchmark("arithmetic-2digit").load("train", max_examples=5)
    assert all(10 <= t.metadata["a"] <= 99 for t in two)


def test_score_reasons_from_episode() -> None:
    bench = get_benchmark("arithmetic")
    task = bench.load(max_examples=1)[0]

    def ep(text: str, finish: str = "stop", **kw: object) -> Episode:
        step = Step(text=text, finish_reason=finish)
        return Episode(task=task, trajectories=[Trajectory(steps=[step])], **kw)  # type: ignore[arg-type]

    assert bench.score(task, ep(task.ground_truth)).reason == "correct"
    assert bench.score(task, ep("I think")).reason == "no_answer_extracted"
    assert bench.score(task, ep("It is 1234", finish="length")).reason == "truncated"
    assert bench.score(task, ep("", termination_reason="timeout", error="slow")).reason == "timeout"
    assert bench.score(task, ep("", termination_reason="error", error="boom")).reason == "error"
    ok = ep("x", artifacts={"answer": task.ground_truth})
    assert bench.score(task, ok).is_correct


def test_frozenlake_plan_and_reasons() -> None:
    bench = get_benchmark("frozenlake")
    task = bench.load("train", max_examples=1)[0]
    assert "P" in str(task.instruction)
    assert bench.grade(task, "LEFT").reason == "wrong_answer"
    assert bench.grade(task, "I don't know").reason == "no_answer_extracted"
    assert bench.score(task, Episode(task=task, artifacts={"outcome": "format", "actions": [], "invalid_moves": 3})
                       ).reason == "format_error"


def test_public_surface() -> None:
    import rllm_envs.benchmarks as benchmarks
    import rllm_envs.eval as evaluation
    import rllm_envs.rewards as rewards
    import rllm_envs.workflows as workflows
    import rllm_rollout.engine as engine

    assert {"Benchmark", "get_benchmark", "list_benchmarks", "RewardResult"} <= set(benchmarks.__all__)
    assert {"run_episodes", "score_episode"} <= set(engine.__all__)
    assert {"grade_math", "grade_choice", "grade_code", "run_python", "RewardResult", "REASONS"} <= set(rewards.__all__)
    assert {"solver_judge", "iterative_refinement", "self_debate", "get_workflow"} <= set(workflows.__all__)
    assert {"run_eval", "EvalOptions", "pass_at_k", "summarize", "load_agent"} <= set(evaluation.__all__)
    for mod in (benchmarks, engine, evaluation, rewards, workflows):
        assert all(hasattr(mod, name) for name in mod.__all__)


def test_third_party_benchmark_through_the_hook() -> None:
    from rllm_core.hookspecs import hookimpl
    from rllm_core.plugins import get_plugin_manager, reset_plugin_manager
    from rllm_envs.rewards import RewardResult

    class Echo(Benchmark):
        name, category, reward = "echo-test", "demo", "exact"

        def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
                 seed: int = 0) -> list[Task]:
            return [self._task(0, split, "say hi", "hi")]

        def grade(self, task: Task, response: str) -> RewardResult:
            return RewardResult.correct(response) if response.strip() == task.ground_truth else \
                RewardResult.fail("wrong_answer", response)

    class Plugin:
        @hookimpl
        def rllm_register_benchmarks(self) -> list[Benchmark]:
            return [Echo()]

    reset_plugin_manager()
    try:
        get_plugin_manager().register(Plugin(), name="echo-plugin")
        bench = get_benchmark("echo-test")
        assert bench.grade(bench.load()[0], "hi").is_correct
        assert len(list_benchmarks()) >= 61
    finally:
        reset_plugin_manager()
    with pytest.raises(BenchmarkError):
        get_benchmark("echo-test")


def test_file_sets_load_from_the_hub_when_no_local_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a local file the same set comes from `datasets.load_dataset` with its id, config and split."""
    import datasets

    calls: list[tuple[object, ...]] = []

    def fake_load(path: str, name: str | None = None, split: str | None = None) -> list[dict[str, str]]:
        calls.append((path, name, split))
        return [{"question": "Tom has 2 apples and gets 3. How many?", "answer": "2 + 3 = 5\n#### 5"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setattr("rllm_envs.benchmarks.dataset.hub_unreachable", lambda: None)  # as if online
    monkeypatch.setenv("RLLM_DATA_DIR", str(tmp_path))
    bench = get_benchmark("gsm8k")
    assert not bench.offline
    (task,) = bench.load("test", max_examples=1)
    assert calls == [("openai/gsm8k", "main", "test[:1]")]
    assert task.ground_truth == "5" and bench.grade(task, "\\boxed{5}").is_correct
    get_benchmark("aime24").load("test")  # the Hub keeps AIME 2024 in its 'train' split
    assert calls[-1] == ("HuggingFaceH4/aime_2024", None, "train")


def test_unreachable_hub_fails_fast_with_the_dataset_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from rllm_rollout.benchmarks import data

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("RLLM_DATA_DIR", str(tmp_path))
    data.hub_unreachable.cache_clear()
    try:
        started = time.monotonic()
        with pytest.raises(BenchmarkError) as err:
            get_benchmark("gpqa_diamond").load(max_examples=1)
        assert time.monotonic() - started < 10
        msg = str(err.value)
        assert "'Idavidrein/gpqa'" in msg and "not reachable" in msg and "gpqa_diamond/test.jsonl" in msg
    finally:
        data.hub_unreachable.cache_clear()


def test_bench_cli_rejects_a_missing_data_dir(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rllm.cli.app import build_app

    res = CliRunner().invoke(build_app(), ["bench", "list", "--data-dir", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output and "--data-dir" in res.output


def test_multidigit_arithmetic_has_no_repeats() -> None:
    for name in ("arithmetic-2digit", "arithmetic-multidigit"):
        tasks = get_benchmark(name).load("train")
        assert len(tasks) == 1000 and len({t.instruction for t in tasks}) == 1000
    many = get_benchmark("arithmetic-2digit").load("test", max_examples=2500)  # more than the split holds
    assert len(many) == 2500


def test_registry_rejects_an_object_that_is_not_a_benchmark() -> None:
    from rllm_core.errors import PluginError
    from rllm_core.hookspecs import hookimpl
    from rllm_core.plugins import get_plugin_manager, reset_plugin_manager

    class NotABenchmark:
        name, category, reward = "half", "demo", "exact"

    class Plugin:
        @hookimpl
        def rllm_register_benchmarks(self) -> list[object]:
            return [NotABenchmark()]

    reset_plugin_manager()
    try:
        get_plugin_manager().register(Plugin(), name="half-plugin")
        with pytest.raises(PluginError, match=r"has no 'load'.*subclass rllm_rollout\.benchmarks\.base\.Benchmark"):
            list_benchmarks()
    finally:
        reset_plugin_manager()
