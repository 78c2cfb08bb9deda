"""`rllm eval` end to end (CLI), its summary numbers, and every kind of bad input it must explain."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.io import read_jsonl
from rllm_core.net import free_port
from rllm_testing.fake_upstream import start_fake_upstream

runner = CliRunner()

AGENTS = '''
import rllm
from rllm_rollout.chat import chat, make_client, task_messages

@rllm.rollout
async def flaky(task, config):
    if task.id.endswith(":0"):
        raise RuntimeError("my agent broke")
    async with make_client(config) as client:
        return {"answer": (await chat(client, config, task_messages(task))).text}

def not_a_rollout(task, config):
    return "x"

NUMBER = 3
'''


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_HOME", str(tmp_path / "home"))  # no user model config leaks in
    monkeypatch.setenv("RLLM_DATA_DIR", str(shared_data_dir))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_agents.py").write_text(AGENTS)


def _invoke(*args: str) -> Any:
    return runner.invoke(build_app(), list(args), catch_exceptions=False)


def _gsm8k_responder(body: dict[str, Any]) -> str:
    """Right on Janet's ducks (18), wrong otherwise."""
    text = str(body["messages"])
    return "So the answer is \\boxed{18}." if "Janet" in text else "I think it is \\boxed{1}."


def test_eval_fake_upstream_writes_files_and_summary(tmp_path: Path) -> None:
    with start_fake_upstream(_gsm8k_responder) as up:
        res = _invoke("eval", "gsm8k", "--max-examples", "3", "--base-url", up.base_url, "--model", "fake",
                      "--attempts", "2", "--output", str(tmp_path / "out"), "--no-progress")
    assert res.exit_code == 0, res.output
    eps = read_jsonl(tmp_path / "out" / "episodes.jsonl")
    assert len(eps) == 6 and all(ep.steps and ep.steps[0].trainable for ep in eps)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["pass_at_k"] == {"pass@1": pytest.approx(1 / 3), "pass@2": pytest.approx(1 / 3)}
    assert summary["reasons"] == {"wrong_answer": 4, "correct": 2}
    assert summary["benchmark"] == "gsm8k" and summary["model"] == "fake" and summary["completion_tokens"] > 0
    assert summary["config"]["temperature"] == 1.0 and summary["config"]["attempts"] == 2
    assert "accuracy" in res.output and "pass@2" in res.output


@pytest.mark.parametrize("spec", ["my_agents:flaky", "my_agents.py:flaky"], ids=["module", "file"])
def test_eval_agent_crash_is_counted_and_run_goes_on(tmp_path: Path, spec: str) -> None:
    with start_fake_upstream(_gsm8k_responder) as up:
        res = _invoke("eval", "gsm8k", "-n", "3", "--base-url", up.base_url, "--agent", spec,
                      "-o", str(tmp_path / "o"), "--no-progress")
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["reasons"] == {"wrong_answer": 2, "error": 1}  # task 0 (the one answered right) crashed
    assert summary["errors"] == 1 and summary["n_episodes"] == 3
    assert summary["model"] == "fake-model"  # no --model: the one the endpoint lists at /models
    crashed = [e for e in read_jsonl(tmp_path / "o" / "episodes.jsonl") if e.reward_reason == "error"]
    assert "my agent broke" in (crashed[0].error or "")
    assert summary["first_error"] == "RuntimeError: my agent broke"  # a failed run says why, not just "error 1"
    assert "1 of 3 episodes failed; first error: RuntimeError: my agent broke" in " ".join(res.output.split())


def test_eval_workflow_and_timeout(tmp_path: Path) -> None:
    with start_fake_upstream(_gsm8k_responder, delay_s=0.3) as up:
        res = _invoke("eval", "gsm8k", "-n", "2", "--base-url", up.base_url, "--workflow", "solver-judge",
                      "--timeout", "0.2", "-o", str(tmp_path / "w"), "--no-progress")
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "w" / "summary.json").read_text())
    assert summary["reasons"] == {"timeout": 2} and summary["config"]["rollout"] == "solver_judge"


@pytest.mark.parametrize(("args", "expected"), [
    (["eval", "gsm8", "--base-url", "http://127.0.0.1:9/v1"], r"unknown benchmark 'gsm8'.*gsm8k"),
    (["eval", "gsm8k", "--agent", "no_such_module:solve"], r"module 'no_such_module' could not be imported"),
    (["eval", "gsm8k", "--agent", "my_agents:not_a_rollout"], r"plain function, not a rollout.*@rllm.rollout"),
    (["eval", "gsm8k", "--agent", "my_agents:NUMBER"], r"is a int .*not an @rllm.rollout"),
    (["eval", "gsm8k", "--agent", "my_agents:missing"], r"has no attribute 'missing'"),
    (["eval", "gsm8k", "--workflow", "nope"], r"unknown workflow 'nope'"),
    (["eval", "gsm8k", "--split", "dev"], r"no split 'dev'"),
    (["eval", "gsm8k", "--agent", "my_agents.py:solve"], r"'my_agents.py' has no attribute 'solve'.*'flaky'"),
    (["eval", "gsm8k", "--agent", "missing_agents.py:flaky"], r"missing_agents.py does not exist"),
    (["eval", "gsm8k", "--agent", "./my_agents:flaky"], r"must name the .py file \(--agent ./my_agents.py:flaky\)"),
])
def test_eval_bad_input_is_explained(args: list[str], expected: str) -> None:
    res = _invoke(*args, "--no-progress")
    assert res.exit_code == 2
    assert re.search(expected, " ".join(res.output.split())), res.output


def test_eval_unreachable_endpoint_fails_before_any_episode(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
    res = _invoke("eval", "gsm8k", "-n", "2", "--base-url", url, "-o", str(tmp_path / "never"), "--no-progress")
    assert res.exit_code == 2
    assert url in " ".join(res.output.split()) and "not reachable" in res.output
    assert not (tmp_path / "never").exists()


def test_eval_bad_data_file_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "data" / "svamp"
    bad.mkdir(parents=True)
    (bad / "test.jsonl").write_text(json.dumps({"Body": "x", "Answer": 1}) + "\n")
    res = _invoke("eval", "svamp", "--data-dir", str(tmp_path / "data"), "--base-url", "http://127.0.0.1:9/v1")
    assert res.exit_code == 2
    flat = " ".join(res.output.split())
    assert "svamp/test.jsonl:1" in flat and "'Question' or 'question'" in flat


def test_eval_data_dir_without_the_file_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    res = _invoke("eval", "gsm8k", "--data-dir", str(tmp_path / "empty"), "--base-url", "http://127.0.0.1:9/v1")
    assert res.exit_code == 2
    flat = "".join(res.output.split())  # rich wraps long paths
    assert f"Nolocalfile{tmp_path}/empty/gsm8k/test.jsonl".replace(" ", "") in flat and "openai/gsm8k" in flat


def test_bench_list_json() -> None:
    res = _invoke("bench", "list", "--json")
    assert res.exit_code == 0
    rows = json.loads(res.output)
    assert len(rows) >= 60 and sum(r["offline"] for r in rows) >= 15
    gsm = next(r for r in rows if r["name"] == "gsm8k")
    assert gsm == {**gsm, "category": "math", "rows": 1319, "reward": "math_verify", "offline": True}
    assert _invoke("bench", "list").exit_code == 0
    shown = _invoke("bench", "show", "arithmetic")
    assert shown.exit_code == 0 and "What is" in shown.output


@pytest.mark.slow
def test_eval_gsm8k_tiny_random_end_to_end(tmp_path: Path) -> None:
    """The embedded path: no --base-url, the local policy server with tiny-random, through the gateway."""
    res = _invoke("eval", "gsm8k", "--max-examples", "5", "--model", "tiny-random", "--max-tokens", "8",
                  "-o", str(tmp_path / "e2e"), "--no-progress")
    assert res.exit_code == 0, res.output
    eps = read_jsonl(tmp_path / "e2e" / "episodes.jsonl")
    assert len(eps) == 5
    for ep in eps:
        (step,) = ep.steps
        assert step.trainable and step.token_source == "server" and len(step.completion_token_ids or []) <= 8
        assert ep.reward_reason in ("wrong_answer", "no_answer_extracted", "truncated", "correct")
    summary = json.loads((tmp_path / "e2e" / "summary.json").read_text())
    assert summary["n_episodes"] == 5 and summary["model"] and summary["config"]["endpoint_source"] == "embedded"


@pytest.mark.parametrize(("args", "expected"), [
    (["-n", "0"], r"--max-examples must be at least 1"),
    (["--attempts", "0"], r"--attempts and --concurrency must be at least 1"),
    (["--timeout", "-1"], r"--timeout must be a positive number"),
    (["--max-tokens", "0"], r"--max-tokens must be at least 1"),
    (["--temperature", "-1"], r"--temperature must be 0 or more"),
])
def test_eval_bad_numbers_are_explained(args: list[str], expected: str) -> None:
    res = _invoke("eval", "gsm8k", "--base-url", "http://127.0.0.1:9/v1", *args, "--no-progress")
    assert res.exit_code == 2 and re.search(expected, " ".join(res.output.split())), res.output


def test_eval_workflow_with_options(tmp_path: Path) -> None:
    with start_fake_upstream(_gsm8k_responder) as up:
        res = _invoke("eval", "gsm8k", "-n", "1", "--base-url", up.base_url, "--workflow", "self-debate:rounds=1",
                      "-o", str(tmp_path / "d"), "--no-progress")
    assert res.exit_code == 0, res.output
    (ep,) = read_jsonl(tmp_path / "d" / "episodes.jsonl")
    assert sorted(t.name for t in ep.trajectories) == ["debater", "debater", "moderator"]
    assert ep.reward_reason == "correct" and len(ep.artifacts["transcript"]) == 1
    roles = json.loads((tmp_path / "d" / "summary.json").read_text())["roles"]
    assert roles == {"debater": {"trajectories": 2, "mean_reward": 1.0, "reasons": {"correct": 2}},
                     "moderator": {"trajectories": 1, "mean_reward": 1.0, "reasons": {"correct": 1}}}
    assert "role debater (×2)" in res.output


def test_endpoint_warns_about_an_unlisted_model_and_a_missing_models_route(caplog: pytest.LogCaptureFixture) -> None:
    from rllm_envs.eval.endpoint import open_endpoint

    with start_fake_upstream() as up, caplog.at_level("WARNING", logger="rllm.eval"):
        with open_endpoint(up.base_url, "no-such-model") as ep:
            assert ep.model == "no-such-model"  # a warning only: some servers accept aliases they do not list
        assert "'no-such-model' is not among the models" in caplog.text and "fake-model" in caplog.text
        caplog.clear()
        root = up.base_url.removesuffix("/v1")
        with open_endpoint(root, "m") as ep:
            assert ep.base_url == root
        assert "HTTP 404" in caplog.text and "usually ends in /v1" in caplog.text


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    from math import comb

    from rllm_envs.eval import pass_at_k

    for n, c, k in [(5, 2, 2), (10, 3, 4), (8, 0, 3), (4, 4, 1), (16, 1, 16)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    with pytest.raises(ValueError, match="needs at least 4 attempts"):
        pass_at_k(2, 1, 4)


def test_ctrl_c_says_what_was_kept_and_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C mid-run used to end in a traceback (and wait on the gateway); now one line and exit code 130."""
    import rllm_rollout.engine as engine_mod

    async def interrupted(*args: Any, on_episode: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_mod, "run_episodes", interrupted)  # what the local rollout executor runs
    with start_fake_upstream(_gsm8k_responder) as up:
        res = _invoke("eval", "gsm8k", "-n", "3", "--base-url", up.base_url, "-o", str(tmp_path / "i"), "--no-progress")
    assert res.exit_code == 130
    assert "interrupted: 0 of 3 episodes finished, saved in" in " ".join(res.output.split())
    assert "Traceback" not in res.output and not (tmp_path / "i" / "summary.json").exists()
