"""The seed article's agent, verbatim, with its placeholder key: every call it makes is recorded, through the
run's in-process gateway, an explicit `rllm gateway`-style one, a client of one in another process (what Ray
workers hold), `rllm eval --agent` and `rllm train --agent`; and an agent that takes its key from the environment
or sends none works the same. A real local policy server (tiny-random) answers; nothing is mocked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import rllm
from rllm.cli.app import build_app
from rllm_core.io import read_jsonl
from rllm_core.types import Episode
from rllm_envs.eval import EvalOptions, load_agent, run_eval
from rllm_rollout.gateway import UpstreamConfig, start_gateway

SEED = '''import rllm
from openai import OpenAI

@rllm.rollout
def solve(task, config):                      # your agent, unchanged: it just uses config.base_url
    client = OpenAI(base_url=config.base_url, api_key="EMPTY")
    r = client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": task.instruction}])
    return r.choices[0].message.content
'''
"""The README's "In ten lines" agent, character for character (test_the_readme_holds_the_seed_verbatim)."""


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    from rllm_serve import start_policy_server

    with start_policy_server("tiny-random") as s:
        yield s


@pytest.fixture
def seed_file(tmp_path: Path) -> Path:
    path = tmp_path / "seed_agent.py"
    path.write_text(SEED, encoding="utf-8")
    return path


def _recorded(ep: Episode, calls: int = 1) -> None:
    assert ep.error is None, ep.error
    assert len(ep.steps) == calls
    for step in ep.steps:
        assert step.prompt_token_ids and step.completion_token_ids and step.token_source == "server"
        assert step.logprobs and len(step.logprobs) == len(step.completion_token_ids)


def test_the_readme_holds_the_seed_verbatim() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert SEED.split("\n\n", 1)[1] in readme and 'api_key="EMPTY"' in readme


def test_the_seed_through_the_runs_gateway_and_a_standalone_one(server: Any, seed_file: Path) -> None:
    solve = load_agent(f"{seed_file}:solve")
    task = rllm.Task(id="t1", instruction="What is 2 + 3?")
    _recorded(solve.run(task, base_url=server.base_url, model=server.model_name, sampling={"max_tokens": 8}))
    with start_gateway([UpstreamConfig(url=server.base_url)]) as gw:  # as `rllm gateway` starts it: a token
        assert gw.client_api_key
        _recorded(solve.run(task, gateway=gw, model=server.model_name, sampling={"max_tokens": 8}))
        _recorded(solve.run(task, gateway=gw.remote(), model=server.model_name, sampling={"max_tokens": 8}))


@rllm.rollout
def env_key_agent(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    """OPENAI_API_KEY from the environment (no api_key argument), then a raw request with no key at all."""
    from openai import OpenAI

    client = OpenAI(base_url=config.base_url)
    r = client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4)
    raw = httpx.post(f"{config.base_url}/chat/completions", timeout=60,
                     json={"model": config.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                           "logprobs": True})
    raw.raise_for_status()
    return (r.choices[0].message.content or "") + raw.json()["choices"][0]["message"]["content"]


def test_an_environment_key_or_no_key_works(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-my-shell")
    ep = env_key_agent.run({"id": "env"}, base_url=server.base_url, model=server.model_name)
    _recorded(ep, calls=2)


@pytest.mark.slow
def test_the_seed_in_rllm_eval_and_rllm_train(server: Any, seed_file: Path, tmp_path: Path) -> None:
    result = run_eval(EvalOptions(benchmark="arithmetic", agent=f"{seed_file}:solve", base_url=server.base_url,
                                  model=server.model_name, max_examples=3, output=tmp_path / "eval",
                                  progress=False, max_tokens=8))
    assert result.summary.n_episodes == 3 and result.summary.errors == 0
    for ep in read_jsonl(result.episodes_path):
        _recorded(ep)
    run = tmp_path / "run"
    res = CliRunner().invoke(build_app(), [
        "train", "arithmetic", "--agent", f"{seed_file}:solve", "--model", "tiny-random", "--max-steps", "2",
        "--batch-size", "2", "--group-size", "2", "--max-tokens", "8", "--eval-examples", "0", "--no-bf16",
        "--no-progress", "--output", str(run)])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    for step in (1, 2):
        episodes = read_jsonl(run / "episodes" / f"step_{step}.jsonl")
        assert len(episodes) == 4
        for ep in episodes:
            _recorded(ep)
