"""Reproducible runs: the same `--seed` gives the same tasks, samples and loss curve, bit for bit, on CPU with
`tiny-random`; another seed gives another run; a run resumed from a checkpoint continues the same stream; and a
resume that would change what the steps draw (batch size, group size, seed) is refused unless allowed.

Each request's seed is derived from (run seed, policy version, the batch's tasks, task id, attempt, call index);
the policy server draws every choice from its own generator seeded with it, and computes a seeded row with the
same bits whatever else is in the batch, so the order in which concurrent requests reach it changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.errors import ConfigError
from rllm_core.rewards import RewardResult
from rllm_core.types import Task
from rllm_envs.benchmarks import get_benchmark
from rllm_envs.benchmarks.arithmetic import Arithmetic
from rllm_rollout.rollout import RolloutConfig, derive_seed
from rllm_train.config import TrainConfig, load_config
from rllm_train.loop import _check_resume_config, train
from rllm_train.rundir import RunDir

runner = CliRunner()
SMALL = ["--model", "tiny-random", "--batch-size", "2", "--group-size", "2", "--max-tokens", "8",
         "--eval-examples", "0", "--no-progress"]
COLUMNS = ("reward/mean", "train/loss", "train/grad_norm", "train/pg_loss", "train/approx_kl", "train/entropy")
"""metrics.jsonl columns that must match bit for bit (loss, reward, grad norm, and two that read every logprob)."""


def _cli_train(out: Path, *flags: str) -> None:
    res = runner.invoke(build_app(), ["train", "arithmetic", "--output", str(out), *SMALL, *flags])
    assert res.exit_code == 0, res.output


def _curve(out: Path) -> list[tuple[int, tuple[Any, ...]]]:
    return [(r["step"], tuple(r.get(c) for c in COLUMNS)) for r in RunDir(out).read_metrics()
            if r["kind"] == "train"]


def _completions(out: Path, step: int) -> list[tuple[str, int, list[list[int] | None]]]:
    """(task id, attempt, completion token ids of every call) of each episode of a step, by task and attempt."""
    rows = []
    for line in (out / "episodes" / f"step_{step}.jsonl").read_text().splitlines():
        ep = json.loads(line)
        ids = [s["completion_token_ids"] for t in ep["trajectories"] for s in t["steps"]]
        rows.append((ep["task"]["id"], ep["attempt"], ids))
    return sorted(rows, key=lambda r: (r[0], r[1]))


@pytest.mark.slow
def test_same_seed_same_run_bit_for_bit_and_another_seed_differs(tmp_path: Path) -> None:
    """`rllm train arithmetic --model tiny-random --max-steps 3 --seed 7`, twice: identical, to the last bit."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _cli_train(a, "--max-steps", "3", "--seed", "7")
    _cli_train(b, "--max-steps", "3", "--seed", "7")
    _cli_train(c, "--max-steps", "3", "--seed", "8")
    assert [s for s, _ in _curve(a)] == [1, 2, 3]
    assert _curve(a) == _curve(b)  # floats compared exactly
    for step in (1, 2, 3):
        assert _completions(a, step) == _completions(b, step)
        assert all(ids and all(i for i in ids) for _, _, ids in _completions(a, step))  # token ids were recorded
    assert [_completions(a, s) for s in (1, 2, 3)] != [_completions(c, s) for s in (1, 2, 3)]
    first = json.loads((a / "episodes" / "step_1.jsonl").read_text().splitlines()[0])
    assert isinstance(first["trajectories"][0]["steps"][0]["params"].get("seed"), int)  # the request carried it


class _ParityGraded(Arithmetic):
    """Arithmetic graded by the parity of the reply's character codes: tiny-random gets mixed rewards, so GRPO
    has non-zero advantages and the loss, gradient norm and weights really depend on every sampled token."""

    def grade(self, task: Task, response: str) -> RewardResult:
        if sum(map(ord, response)) % 2 == 0:
            return RewardResult.correct(extracted=response)
        return RewardResult.fail("wrong_answer", extracted=response)


def _learning_run(out: Path, max_steps: int, resume: bool = False, **kw: Any) -> list[dict[str, Any]]:
    bench = _ParityGraded(get_benchmark("arithmetic").level)  # type: ignore[attr-defined]
    config = load_config(None, benchmark="arithmetic", model="tiny-random", batch_size=2, group_size=4,
                         max_tokens=8, eval_examples=0, max_steps=max_steps, seed=7, lr=1e-3, save_every=1,
                         output=str(out), **kw)
    result = train(config, benchmark=bench, resume=resume, progress=False, console=Console(quiet=True))
    return result.history


@pytest.mark.slow
def test_learning_run_repeats_and_a_resume_continues_the_same_stream(tmp_path: Path) -> None:
    """With a reward that varies (and groups of 4) the loss and gradients are non-zero; a 3-step run equals
    itself, and equals a 2-step run resumed to step 3 (same step-3 samples and figures, bit for bit)."""
    full, again, split = tmp_path / "full", tmp_path / "again", tmp_path / "split"
    _learning_run(full, 3)
    _learning_run(again, 3)
    assert _curve(full) == _curve(again)
    assert any(loss != 0.0 and gnorm != 0.0 for _, (_, loss, gnorm, *_) in _curve(full))  # a real signal
    _learning_run(split, 2)
    history = _learning_run(split, 3, resume=True)
    assert len(history) == 1  # only step 3 ran in the resumed process
    assert _curve(split) == _curve(full)
    assert _completions(split, 3) == _completions(full, 3)
    state = json.loads((split / "checkpoints" / "step_3" / "state.json").read_text())
    assert (state["seed"], state["batch_size"], state["group_size"], state["step"]) == (7, 2, 4, 3)


def _saved_run(tmp_path: Path, **kw: Any) -> RunDir:
    run = RunDir(tmp_path).create()
    TrainConfig(model="tiny-random", output=str(tmp_path), batch_size=2, group_size=2, seed=7, **kw) \
        .dump_yaml(run.config_file)
    return run


def test_resume_refuses_a_changed_batch_group_or_seed(tmp_path: Path) -> None:
    run = _saved_run(tmp_path)
    before = run.config_file.read_text()
    same = {"model": "tiny-random", "output": str(tmp_path), "batch_size": 2, "group_size": 2, "seed": 7}
    _check_resume_config(run, TrainConfig(**{**same, "max_steps": 9, "lr": 1e-4}))  # other options: fine
    with pytest.raises(ConfigError, match=r"batch_size 2 → 4, group_size 2 → 3, seed 7 → 8\).*"
                                          r"--allow-resume-changes"):
        _check_resume_config(run, TrainConfig(**{**same, "batch_size": 4, "group_size": 3, "seed": 8}))
    with pytest.raises(ConfigError, match=r"\(seed 7 → 0\)"):
        _check_resume_config(run, TrainConfig(**{**same, "seed": 0}))
    _check_resume_config(run, TrainConfig(**{**same, "seed": 8, "allow_resume_changes": True}))  # allowed
    with pytest.raises(ConfigError, match=r"model 'tiny-random' → 'smollm2-135m'"):  # never allowed
        _check_resume_config(run, TrainConfig(**{**same, "model": "smollm2-135m", "allow_resume_changes": True}))
    assert run.config_file.read_text() == before


def test_allow_resume_changes_is_a_flag_for_one_resume(tmp_path: Path) -> None:
    """The CLI refuses before loading anything, and `--allow-resume-changes` lets the same resume through; the
    flag is never written into config.yaml, so it does not silently allow every later resume too."""
    run = _saved_run(tmp_path, max_steps=1)
    (run.checkpoints_dir / "step_1").mkdir()
    (run.checkpoints_dir / "step_1" / "state.json").write_text(json.dumps({"step": 1}))
    res = runner.invoke(build_app(), ["train", "--resume", str(tmp_path), "--group-size", "4", "--no-progress"])
    assert res.exit_code == 1 and "group_size 2 → 4" in res.output and "Traceback" not in res.output
    res = runner.invoke(build_app(), ["train", "--resume", str(tmp_path), "--group-size", "4", "--no-progress",
                                      "--allow-resume-changes"])
    assert res.exit_code == 1 and "group_size" not in res.output  # past the refusal, to the next check:
    assert "already at step 1" in res.output  # (a run with no step left, so nothing loads here)
    assert "allow_resume_changes:" not in run.config_file.read_text()
    assert "allow_resume_changes" not in TrainConfig(allow_resume_changes=True).model_dump()


def test_seeds_are_derived_stably_and_kept_apart() -> None:
    """derive_seed is the same in every process (no salted hash); the engine's seed becomes the episode's, and
    each call of an episode gets its own."""
    assert derive_seed(7, 0, "arithmetic:train:1", 0) == derive_seed(7, 0, "arithmetic:train:1", 0)
    assert len({derive_seed(7, 0, "t", a) for a in range(64)}) == 64
    assert all(0 <= derive_seed(s, "x") < 2**31 for s in range(100))
    config = RolloutConfig(base_url="http://x/v1", model="m", session_id="s", seed=derive_seed(1, "t", 0))
    assert config.call_seed(0) != config.call_seed(1) and config.call_seed(0) == config.call_seed(0)
    assert RolloutConfig(base_url="http://x/v1", model="m", session_id="s").call_seed(0) is None


async def test_engine_seed_seeds_episodes_not_every_call(fake_upstream: Any) -> None:
    """sampling["seed"] is the run's: each (task, attempt) gets its own episode seed, the default rollout sends
    that episode's call seed, and config.sampling never forwards one shared seed; without it nothing is seeded."""
    from rllm_rollout.benchmarks.rollouts import single_turn
    from rllm_rollout.engine import run_episodes

    tasks = [Task(id="t0", instruction="What is 1 + 1?"), Task(id="t1", instruction="What is 1 + 1?")]
    seeded = await run_episodes(single_turn, tasks, base_url=fake_upstream.base_url, attempts=2, progress=False,
                                sampling={"seed": 5, "max_tokens": 4})
    sent = [ep.steps[0].params.get("seed") for ep in seeded]
    expected = [RolloutConfig(base_url="u", model="m", session_id="s",
                              seed=derive_seed(5, ep.task.id, ep.attempt)).call_seed(0) for ep in seeded]
    assert sent == expected and len(set(sent)) == 4
    again = await run_episodes(single_turn, tasks, base_url=fake_upstream.base_url, attempts=2, progress=False,
                               sampling={"seed": 5, "max_tokens": 4})
    assert [ep.steps[0].params.get("seed") for ep in again] == sent
    plain = await run_episodes(single_turn, tasks[:1], base_url=fake_upstream.base_url, progress=False,
                               sampling={"max_tokens": 4})
    assert "seed" not in plain[0].steps[0].params


def test_a_seeded_request_is_the_same_bits_in_any_batch() -> None:
    """The policy server: a seeded request alone, and again while requests of other lengths join and leave the
    batch around it, gives the same token ids and the same logprobs, to the last bit."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from rllm_serve import load_model, start_policy_server

    def ask(client: httpx.Client, content: str, seed: int, max_tokens: int) -> tuple[list[int], list[float]]:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "seed": seed,
                "temperature": 1.0, "logprobs": True, "return_token_ids": True}
        choice = client.post("/chat/completions", json=body).json()["choices"][0]
        return choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]

    with start_policy_server(load_model("tiny-random"), max_batch_size=16) as server, \
            httpx.Client(base_url=server.base_url, timeout=60) as client:
        alone = ask(client, "What is 3 + 4?", 11, 16)
        noise = [("noise " * (3 * i + 1), 100 + i, 4 + 5 * i) for i in range(6)]
        with ThreadPoolExecutor(7) as pool:
            futures = [pool.submit(ask, client, *n) for n in noise]
            busy = ask(client, "What is 3 + 4?", 11, 16)
            others = [f.result() for f in futures]
        with ThreadPoolExecutor(7) as pool:  # and the noise requests alone vs in that batch
            again = list(pool.map(lambda n: ask(client, *n), noise[::-1]))[::-1]
    assert busy == alone and len(alone[0]) == 16
    assert others == again
