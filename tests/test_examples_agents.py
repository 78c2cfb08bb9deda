"""The framework agents in examples/agents, loaded by file path exactly as their docstrings type them
(`--agent examples/agents/langgraph_frozenlake.py:agent`), then evaluated and trained unchanged.

Fast: `load_agent`'s file-path form (sibling imports, one module per file, one-line errors), and each example
against a scripted fake upstream that plays it right (FrozenLake's shortest path; the checker overruling a
wrong solver), so the graph / team logic is checked, not only the plumbing. Slow: `tiny-random` end to end,
2 training steps each through `rllm_train.loop.train`, and one `rllm_envs.eval` run each. tiny-random
babbles, so its FrozenLake moves are nearly all invalid: those tests check what was recorded and trained (the
trajectory names, one packed row per multi-turn game with its observations masked out), not accuracy.
"""

from __future__ import annotations

import itertools
import json
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from rllm_core.errors import ConfigError
from rllm_core.io import read_jsonl
from rllm_core.types import Episode
from rllm_envs.benchmarks.frozenlake import ACTIONS, FrozenLake
from rllm_envs.benchmarks.frozenlake import solve as shortest_path
from rllm_envs.eval import EvalOptions, load_agent, run_eval
from rllm_envs.workflows.roles import RoleRollout
from rllm_rollout.rollout import Rollout
from rllm_testing.fake_upstream import start_fake_upstream
from rllm_train.config import load_config
from rllm_train.loop import train
from rllm_train.packing import pack_trajectory

ROOT = Path(__file__).resolve().parents[1]
LANGGRAPH = "examples/agents/langgraph_frozenlake.py:agent"
AUTOGEN = "examples/agents/autogen_team.py:team"
RETRY = "examples/agents/langgraph_retry.py:agent"
OUTCOMES = {"goal", "hole", "max_turns", "format", "context_exceeded"}


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the specs are relative paths, as a user types them from a checkout


@pytest.fixture
def _own_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test's files load as modules, and their folders go on sys.path: both undone after it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("_rllm_agent_") or name == "helper_for_agent":
            del sys.modules[name]


def _mask_runs(mask: list[int]) -> list[int]:
    """The loss mask as its runs: [0, 1, 0, 1] is prompt, reply, observation, reply."""
    return [mask[0]] + [b for a, b in itertools.pairwise(mask) if a != b]


# ------------------------------------------------------------------------------- load_agent: file paths
SIBLING_AGENT = '''
import rllm
from helper_for_agent import ANSWER   # a module next to this file

@rllm.rollout
def solve(task, config):
    return {"answer": ANSWER}
'''


@pytest.mark.usefixtures("_own_modules")
def test_load_agent_takes_a_file_path_and_its_sibling_imports(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "my agents"
    folder.mkdir()
    (folder / "helper_for_agent.py").write_text("ANSWER = '42'\n")
    (folder / "agent_file.py").write_text(SIBLING_AGENT)
    other = tmp_path / "elsewhere"
    (other / "my agents").mkdir(parents=True)
    (other / "my agents" / "agent_file.py").write_text("import rllm\nsolve = rllm.rollout(lambda t, c: 'other')\n")
    monkeypatch.chdir(tmp_path)
    rollout = load_agent("my agents/agent_file.py:solve")
    assert isinstance(rollout, Rollout) and rollout.fn(None, None) == {"answer": "42"}
    assert str(folder) == sys.path[0]
    assert load_agent(f"{folder}/agent_file.py:solve").fn is rollout.fn  # the same file, absolute: loaded once
    same_stem = load_agent("elsewhere/my agents/agent_file.py:solve")  # same file name, other folder: its own module
    assert same_stem is not rollout and same_stem.fn(None, None) == "other"
    module = sys.modules[rollout.fn.__module__]
    assert module.__file__ == str(folder / "agent_file.py") and rollout.fn.__module__.startswith("_rllm_agent_")


ROLE_AGENT = '''
import rllm
from rllm_envs.workflows.roles import RoleRollout
from helper_for_agent import ANSWER

@rllm.rollout
def solve(task, config):
    return {"answer": ANSWER}

debate = RoleRollout(lambda task, config: ANSWER, name="debate", roles=("solver", "judge"))
'''


@pytest.mark.usefixtures("_own_modules")
def test_a_rollout_loaded_from_a_file_unpickles_in_another_process(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Ray rollout worker does with `--rollout-workers`: it cannot import the made-up module name the file
    was loaded as, so the rollout pickles as its file path and attribute, and the worker loads the file."""
    folder = tmp_path / "agents"
    folder.mkdir()
    (folder / "helper_for_agent.py").write_text("ANSWER = '42'\n")
    (folder / "roles_file.py").write_text(ROLE_AGENT)
    monkeypatch.chdir(tmp_path)
    solve, debate = load_agent("agents/roles_file.py:solve"), load_agent("agents/roles_file.py:debate")
    assert isinstance(debate, RoleRollout) and debate.roles == ("solver", "judge")  # its class is kept
    (tmp_path / "rollouts.pkl").write_bytes(pickle.dumps([solve, debate]))
    script = ("import pickle, sys; from rllm_envs.workflows.roles import RoleRollout\n"
              "solve, debate = pickle.load(open(sys.argv[1], 'rb'))\n"
              "assert isinstance(debate, RoleRollout) and debate.roles == ('solver', 'judge'), debate\n"
              "print(solve.name, solve.fn(None, None)['answer'], debate.name, debate.fn(None, None))")
    elsewhere = tmp_path / "worker"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "rollouts.pkl")], cwd=elsewhere,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["solve", "42", "debate", "42"]


@pytest.mark.parametrize(("spec", "expected"), [
    ("no_such_file.py:solve", r"no_such_file\.py does not exist$"),
    ("folder/:solve", r"folder is a folder: name the \.py file in it \(--agent folder/FILE\.py:solve\)"),
    ("./my_agents:solve", r"must name the \.py file \(--agent \./my_agents\.py:solve\), or give a module name "
                          r"\(--agent my_agents:solve\)"),
    ("folder.py:solve", r"folder\.py is a folder: name the \.py file in it"),
    ("raises.py:solve", r"running .*raises\.py raised RuntimeError: broken at import"),
    ("imports_missing.py:solve", r"imports_missing\.py could not be imported \(No module named 'not_a_module_xyz'\)"),
    ("fine.py:nope", r"'fine\.py' has no attribute 'nope'; it has \[.*'solve'"),
    ("fine.py:", r"a name on both sides of the colon"),
])
@pytest.mark.usefixtures("_own_modules")
def test_load_agent_file_errors_are_one_line(spec: str, expected: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "folder.py").mkdir()
    (tmp_path / "folder").mkdir()
    (tmp_path / "raises.py").write_text("raise RuntimeError('broken at import')\n")
    (tmp_path / "imports_missing.py").write_text("import not_a_module_xyz\n")
    (tmp_path / "fine.py").write_text("import rllm\nsolve = rllm.rollout(lambda t, c: 'x')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_agent(spec)
    message = str(err.value)
    assert "\n" not in message and re.search(expected, message), message
    assert not any(name.startswith("_rllm_agent_raises") for name in sys.modules)  # a failed load leaves nothing


def test_both_examples_load_as_typed() -> None:
    assert load_agent(LANGGRAPH).name == "langgraph_frozenlake"
    assert load_agent(AUTOGEN).name == "autogen_team"
    assert load_agent(RETRY).name == "langgraph_retry"


def _right_on_the_second_try(body: dict[str, Any]) -> str:
    """Off by one on the first try; after the checker's feedback, the right number."""
    messages = body["messages"]
    a, b = re.search(r"What is (\d+) \+ (\d+)\?", str(messages[0]["content"])).groups()  # type: ignore[union-attr]
    return str(int(a) + int(b) + (1 if len(messages) == 1 else 0))


def test_langgraph_retry_tries_again_after_feedback(tmp_path: Path) -> None:
    with start_fake_upstream(_right_on_the_second_try) as up:
        result = run_eval(EvalOptions(benchmark="arithmetic", agent=RETRY, base_url=up.base_url, max_examples=3,
                                      output=tmp_path / "eval", progress=False, max_tokens=8))
    assert result.summary.accuracy == 1.0
    for ep in read_jsonl(result.episodes_path):
        assert ep.artifacts["tries"] == 2 and ep.artifacts["solved"] is True
        (traj,) = ep.trajectories
        assert traj.name == "solver" and len(traj.steps) == 2
        assert [m["role"] for m in traj.steps[1].messages or []] == ["user", "assistant", "user"]


# ----------------------------------------------------------------------- the examples, scripted upstream
def _shortest_path_player(body: dict[str, Any]) -> str:
    """Plays the map in the first message by its shortest path, one move per assistant turn so far."""
    messages = body["messages"]
    text = str(messages[0]["content"]).split("Map:\n", 1)[1]
    desc = [row.replace("P", "S") for row in text.split("\n\n", 1)[0].splitlines()]
    path = shortest_path(desc) or []
    turn = sum(m["role"] == "assistant" for m in messages)
    return f"I will go {ACTIONS[path[turn]].lower()}." if turn < len(path) else "UP"


def test_langgraph_frozenlake_plays_the_game_and_is_scored_by_the_benchmark(tmp_path: Path) -> None:
    with start_fake_upstream(_shortest_path_player) as up:
        result = run_eval(EvalOptions(benchmark="frozenlake", agent=LANGGRAPH, base_url=up.base_url,
                                      max_examples=3, output=tmp_path / "eval", progress=False, max_tokens=64))
    assert result.summary.accuracy == 1.0
    tasks = {t.id: t for t in FrozenLake().load("test", max_examples=3)}
    for ep in read_jsonl(result.episodes_path):
        art = ep.artifacts
        assert ep.error is None and ep.reward == 1.0 and art["outcome"] == "goal" and art["reached_goal"]
        assert art["actions"] == tasks[ep.task.id].ground_truth and art["invalid_moves"] == 0
        (traj,) = ep.trajectories
        assert traj.name == "player" and len(traj.steps) == art["turns"] == len(art["actions"])
        last = traj.steps[-1].messages or []
        # one conversation: the map, then move / observation pairs (the last call's prompt holds all before it)
        assert [m["role"] for m in last] == ["user", "assistant"] * (art["turns"] - 1) + ["user"]
        assert last[2]["content"].startswith(f"You moved {art['actions'][0]}.\n")


def _arithmetic_pair(body: dict[str, Any]) -> str:
    """The solver is off by one; the checker (its system prompt says so) recomputes and corrects it."""
    messages = body["messages"]
    a, op, b = re.search(r"What is (\d+) ([-+*]) (\d+)\?", str(messages)).groups()  # type: ignore[union-attr]
    value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    if "You check another agent" in str(messages[0]["content"]):
        return f"The solution is wrong. Answer: {value}"
    return f"Answer: {value + 1}"


def test_autogen_team_checker_gives_the_final_answer(tmp_path: Path) -> None:
    with start_fake_upstream(_arithmetic_pair) as up:
        result = run_eval(EvalOptions(benchmark="arithmetic", agent=AUTOGEN, base_url=up.base_url, max_examples=3,
                                      output=tmp_path / "eval", progress=False, max_tokens=64))
    assert result.summary.accuracy == 1.0  # the checker's answer, not the solver's (which is off by one)
    for ep in read_jsonl(result.episodes_path):
        assert [(t.name, len(t.steps)) for t in ep.trajectories] == [("solver", 1), ("checker", 1)]
        solver, checker = (t.steps[0] for t in ep.trajectories)
        assert solver.agent == "solver" and checker.agent == "checker"
        assert checker.messages and checker.messages[-1]["content"] == solver.text  # the checker read the solver
        assert ep.artifacts["answer"] == checker.text


# --------------------------------------------------------------------------------- tiny-random, trained
def _train(tmp_path: Path, benchmark: str, agent: str, bench: Any = None, **extra: Any
           ) -> tuple[list[dict[str, Any]], Path]:
    """2 steps of 2 tasks x 2 attempts, 8 tokens a call, no validation, fp32 (bf16 autocast, which arithmetic
    recommends, is several times slower on CPU); the train records and the run dir."""
    out = tmp_path / "run"
    options = {"model": "tiny-random", "batch_size": 2, "group_size": 2, "max_steps": 2, "eval_examples": 0,
               "max_tokens": 8, "concurrency": 4, "save_every": 2, "lr": 1e-4, "bf16": False, **extra}
    config = load_config(None, benchmark=benchmark, agent=agent, output=str(out), **options)
    result = train(config, benchmark=bench, progress=False, console=Console(quiet=True))
    assert result.steps_done == 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == [1, 2] and not any("skipped" in r for r in steps), steps
    return steps, out


def _episodes(run: Path, step: int) -> list[Episode]:
    episodes = read_jsonl(run / "episodes" / f"step_{step}.jsonl")
    assert len(episodes) == 4 and all(ep.error is None for ep in episodes), [ep.error for ep in episodes]
    return episodes


@pytest.mark.slow
def test_train_langgraph_frozenlake_packs_each_game_into_one_masked_row(tmp_path: Path) -> None:
    lake = FrozenLake()
    lake.max_turns = 4  # the real benchmark with shorter games (16 turns a game would take 4x as long)
    steps, run = _train(tmp_path, "frozenlake", LANGGRAPH, lake)
    for record in steps:
        # one row per game (one trajectory per episode), no game split into several rows, more turns than rows
        assert record["pack/rows"] == record["episode/count"] == 4
        assert record["pack/rows_split"] == 0 and record["pack/steps_used"] > record["pack/rows"]
        assert record["pack/trained_tokens"] < record["pack/tokens"]
    for step in (1, 2):
        for ep in _episodes(run, step):
            assert ep.artifacts["outcome"] in OUTCOMES
            (traj,) = ep.trajectories
            assert traj.name == "player" and {s.metadata.get("node") for s in traj.steps} == {"player"}
            (row,), _ = pack_trajectory(traj, 1.0)
            # prompt, then reply / observation alternating: the observations between the replies are masked
            assert _mask_runs(row.loss_mask) == [0, 1] * len(traj.steps)
            assert row.num_trained_tokens == sum(len(s.completion_token_ids or []) for s in traj.steps)
            seeds = [s.params.get("seed") for s in traj.steps]  # config.call_seed: each call its own
            assert None not in seeds and len(set(seeds)) == len(seeds)


@pytest.mark.slow
def test_train_autogen_team_one_trajectory_per_agent(tmp_path: Path) -> None:
    steps, run = _train(tmp_path, "arithmetic", AUTOGEN)
    for record in steps:
        assert record["role/solver/trajectories"] == record["role/checker/trajectories"] == 4
        assert record["pack/rows"] == 8 and record["pack/trained_tokens"] > 0
    for step in (1, 2):
        for ep in _episodes(run, step):
            assert [(t.name, len(t.steps)) for t in ep.trajectories] == [("solver", 1), ("checker", 1)]
            assert [s.agent for s in ep.steps] == ["solver", "checker"]
            assert all(s.completion_token_ids and s.logprobs for s in ep.steps)


@pytest.mark.slow
def test_train_langgraph_retry_packs_every_try_into_one_masked_row(tmp_path: Path) -> None:
    steps, run = _train(tmp_path, "arithmetic", RETRY)
    for record in steps:
        assert record["pack/rows"] == 4 and record["pack/rows_split"] == 0
        assert record["pack/steps_used"] > record["pack/rows"]  # tiny-random is wrong: it tries 3 times
    for ep in _episodes(run, 1):
        (traj,) = ep.trajectories
        (row,), _ = pack_trajectory(traj, 1.0)
        assert _mask_runs(row.loss_mask) == [0, 1] * len(traj.steps)  # the checker's feedback is masked


@pytest.mark.slow
def test_train_autogen_team_one_lora_adapter_per_agent(tmp_path: Path) -> None:
    """`--roles solver=lora:solver,checker=lora:checker`: the AutoGen agents' calls reach their own adapters (the
    gateway rewrites the model name by agent), each adapter trains on its own rows and is saved for reloading."""
    from peft import PeftModel

    from rllm_core.rewards import RewardResult
    from rllm_envs.benchmarks import get_benchmark
    from rllm_serve import load_model

    always_right = get_benchmark("arithmetic")  # every answer earns 1: with reinforce, every row has a gradient
    always_right.grade = lambda task, response: RewardResult.correct(extracted=response[:8])  # type: ignore[method-assign]
    steps, run = _train(tmp_path, "arithmetic", AUTOGEN, always_right,
                        roles="solver=lora:solver,checker=lora:checker", lr=1e-2, algo="reinforce")
    for record in steps:
        assert record["train/adapter/solver/rows"] == record["train/adapter/checker/rows"] == 4
        assert record["train/adapter/shared/rows"] == 0
    ckpt = run / "checkpoints" / "step_2"
    loaded = load_model("tiny-random")
    reloaded = PeftModel.from_pretrained(loaded.model, str(ckpt / "adapters" / "solver"), adapter_name="solver")
    reloaded.load_adapter(str(ckpt / "adapters" / "checker"), adapter_name="checker")
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        reloaded.set_adapter("solver")
        solver_logits = reloaded(ids).logits
        reloaded.set_adapter("checker")
        checker_logits = reloaded(ids).logits
    assert not torch.allclose(solver_logits, checker_logits)  # two policies, trained apart


@pytest.mark.slow
def test_self_debate_with_an_adapter_per_role_as_typed(tmp_path: Path) -> None:
    """The issue's command, scaled down to tiny-random: gsm8k from ../shared/data, self-debate, two LoRA roles."""
    from rllm.cli.app import build_app

    res = CliRunner().invoke(build_app(), [
        "train", "gsm8k", "--workflow", "self-debate", "--roles", "debater=lora:debater,moderator=lora:moderator",
        "--model", "tiny-random", "--max-steps", "1", "--batch-size", "1", "--group-size", "2", "--max-tokens", "4",
        "--eval-examples", "0", "--no-bf16", "--no-progress", "--output", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    record = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["train/adapter/debater/rows"] == 4 and record["train/adapter/moderator/rows"] == 2
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "step_1" / "adapters").iterdir()
                  if p.is_dir()) == ["debater", "moderator", "shared"]


# -------------------------------------------------------------------------------- tiny-random, evaluated
@pytest.fixture(scope="module")
def tiny_server() -> Iterator[Any]:
    from rllm_serve import start_policy_server

    server = start_policy_server("tiny-random")
    try:
        yield server
    finally:
        server.stop()


def _eval(tiny_server: Any, tmp_path: Path, benchmark: str, agent: str, max_tokens: int) -> Episode:
    result = run_eval(EvalOptions(benchmark=benchmark, agent=agent, base_url=tiny_server.base_url,
                                  model=tiny_server.model_name, max_examples=1, output=tmp_path / "eval",
                                  progress=False, max_tokens=max_tokens))
    assert result.summary.n_episodes == 1 and result.summary.errors == 0
    (ep,) = read_jsonl(result.episodes_path)
    return ep


@pytest.mark.slow
def test_eval_langgraph_frozenlake_tiny_random(tiny_server: Any, tmp_path: Path) -> None:
    ep = _eval(tiny_server, tmp_path, "frozenlake", LANGGRAPH, max_tokens=8)
    art = ep.artifacts
    assert art["outcome"] in OUTCOMES and ep.reward_reason in {"format_error", "wrong_answer", "correct"}
    (traj,) = ep.trajectories
    assert traj.name == "player" and len(traj.steps) == art["turns"] == len(art["actions"]) + art["invalid_moves"]
    assert all(s.completion_token_ids and s.error is None for s in traj.steps)


@pytest.mark.slow
def test_eval_langgraph_frozenlake_ends_when_the_context_is_full(tiny_server: Any, tmp_path: Path) -> None:
    """tiny-random's context is 2048 tokens: the map prompt plus 2000 new tokens does not fit, so the server
    refuses the first turn, and the game ends as "context_exceeded" (not an agent crash)."""
    ep = _eval(tiny_server, tmp_path, "frozenlake", LANGGRAPH, max_tokens=2000)
    art = ep.artifacts
    assert ep.error is None and art["outcome"] == "context_exceeded" and art["turns"] == 0
    assert art["context_exceeded_at_turn"] == 1 and "context length of 2048" in art["context_exceeded_message"]
    assert ep.reward == 0.0 and ep.reward_reason != "error"
    (step,) = ep.steps
    assert "context length" in (step.error or "") and not step.trainable


@pytest.mark.slow
def test_eval_autogen_team_tiny_random(tiny_server: Any, tmp_path: Path) -> None:
    ep = _eval(tiny_server, tmp_path, "arithmetic", AUTOGEN, max_tokens=8)
    assert [(t.name, len(t.steps)) for t in ep.trajectories] == [("solver", 1), ("checker", 1)]
    assert ep.artifacts["answer"] == ep.trajectories[1].steps[0].text and ep.reward_reason is not None
