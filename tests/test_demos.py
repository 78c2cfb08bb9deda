"""Reference demonstrations (`rllm demos`): the benchmark's own agent, unchanged, plays its oracle through the gateway;
FrozenLake's shortest paths reach the goal, every built-in terminal task's solve.sh (as the terminal agent's tool
call) passes its verifier; `rllm sft` renders the recorded calls with the policy's chat template into rows where
only the agent's replies are trained; the held-out split is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_envs.benchmarks import get_benchmark
from rllm_envs.demos.oracles import frozenlake_oracle, harbor_oracle, latest_map
from rllm_envs.demos.server import serve_oracle
from rllm_envs.eval.runner import EvalOptions, run_eval
from rllm_serve.models import load_tokenizer
from rllm_train.sft_data import EpisodeFilter, sft_rows_from_episodes


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_the_frozenlake_oracle_moves_along_a_shortest_safe_path() -> None:
    assert latest_map([_user("Map:\nPFF\nFHH\nFFG\n\nYour move?")]) == ["PFF", "FHH", "FFG"]
    assert frozenlake_oracle([_user("Map:\nPFF\nFHH\nFFG")], None) == {"content": "DOWN"}
    later = [_user("Map:\nPFF\nFHH\nFFG"), {"role": "assistant", "content": "DOWN"},
             _user("You moved DOWN.\nSFF\nPHH\nFFG\n\nYour move?")]
    assert frozenlake_oracle(later, None) == {"content": "DOWN"}
    assert frozenlake_oracle([_user("SFF\nFHH\nFPG")], None) == {"content": "RIGHT"}


def _demos(benchmark: str, tmp_path: Path, **options: object) -> Path:
    bench = get_benchmark(benchmark)
    tasks = bench.load("train", max_examples=options.get("max_examples"))  # type: ignore[arg-type]
    from rllm_envs.demos.oracles import oracle_for

    with serve_oracle(oracle_for(bench, tasks)) as server:
        result = run_eval(EvalOptions(benchmark=benchmark, split="train", base_url=server.url, model="oracle",
                                      temperature=0.0, output=tmp_path / "demos", progress=False, **options))
    assert server.calls > 0
    return result.episodes_path


@pytest.mark.parametrize("agent", [None, "examples/agents/langgraph_frozenlake.py:agent"])
def test_frozenlake_demos_reach_the_goal_and_train_only_the_moves(tmp_path: Path, agent: str | None) -> None:
    episodes = _demos("frozenlake-3x3", tmp_path, max_examples=6, **({"agent": agent} if agent else {}))
    rewards = [json.loads(line)["reward"] for line in episodes.read_text().splitlines()]
    assert rewards == [1.0] * 6
    tokenizer = load_tokenizer("tiny-random")
    rows, counts = sft_rows_from_episodes(episodes.parent, EpisodeFilter(min_reward=1.0),
                                          tokenizer=lambda: tokenizer)
    assert counts["episodes_kept"] == 6 and counts["rows_split"] == 0 and len(rows) == 6  # one row per game
    end = tokenizer.decode([tokenizer.eos_token_id])
    for row in rows:
        trained = tokenizer.decode([t for t, m in zip(row.tokens, row.loss_mask, strict=True) if m])
        moves = trained.split(end)[:-1]
        assert moves and set(moves) <= {"LEFT", "DOWN", "RIGHT", "UP"}, trained
        assert "Your move?" in tokenizer.decode(row.tokens)  # the observations are in the row, masked


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap (.ci/run installs it)")
def test_every_terminal_tasks_solve_sh_passes_its_verifier_as_the_agents_tool_call(tmp_path: Path) -> None:
    tasks = get_benchmark("terminal").load("test")  # all 34 (train 22 + heldout 12), to prove every reference
    assert len(tasks) == 34
    with serve_oracle(harbor_oracle(tasks)) as server:
        result = run_eval(EvalOptions(benchmark="terminal", split="test", base_url=server.url, model="oracle",
                                      temperature=0.0, output=tmp_path / "demos", progress=False, concurrency=4))
    episodes = [json.loads(line) for line in result.episodes_path.read_text().splitlines()]
    failed = {e["task"]["id"]: (e["reward_reason"], e.get("error")) for e in episodes if e["reward"] != 1.0}
    assert len(episodes) == 34 and not failed, failed
    calls = [s for e in episodes for t in e["trajectories"] for s in t["steps"]]
    assert all(s["tool_calls"] or s["text"] for s in calls) and len(calls) == 68  # the script, then "done"
    tokenizer = load_tokenizer("tiny-random")
    rows, counts = sft_rows_from_episodes(result.episodes_path, EpisodeFilter(min_reward=1.0),
                                          tokenizer=lambda: tokenizer)
    assert len(rows) == 34 and counts["rows_split"] == 0  # script call + its output (masked) + "done": one row each
    first = tokenizer.decode([t for t, m in zip(rows[0].tokens, rows[0].loss_mask, strict=True) if m])
    assert first.startswith("<tool_call>") and '"name": "bash"' in first


def test_the_explore_variant_looks_around_before_the_script() -> None:
    task = get_benchmark("terminal").load("train", max_examples=1)[0]
    oracle = harbor_oracle([task], explore=True)
    asked = [_user(str(task.instruction))]
    first = json.loads(oracle(asked, [{"type": "function"}])["tool_calls"][0]["function"]["arguments"])
    assert first == {"command": "ls -la"}
    then = oracle([*asked, {"role": "assistant", "content": ""}, {"role": "tool", "content": "x"}], None)["content"]
    assert then.startswith("```bash\n") and "ls -la" not in then


def test_demos_refuse_the_held_out_split_and_benchmarks_without_an_oracle(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(build_app(), ["demos", "frozenlake-3x3", "--split", "test", "-o", str(tmp_path / "x")])
    assert out.exit_code == 2 and "held out" in out.output
    out = runner.invoke(build_app(), ["demos", "arithmetic", "-o", str(tmp_path / "y")])
    assert out.exit_code == 2 and "has no reference oracle" in out.output
