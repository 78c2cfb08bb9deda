"""What a run is set up with, and what it tells the user: benchmark-recommended settings, the run-directory
guard, the reason a step is skipped, the per-step display lines and the CLI's option list."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.errors import ConfigError
from rllm_core.types import Episode, Step, Task, Trajectory
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder
from rllm_train.config import TrainConfig, load_config
from rllm_train.display import eval_line, step_line
from rllm_train.loop import _skip_reason, train
from rllm_train.rundir import RunDir
from rllm_train.setup import apply_benchmark_defaults


class ShortAnswers(YesNoBenchmark):
    train_defaults = {"max_tokens": 5, "lr": 3e-6, "not_an_option": 1}


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(alternating_responder()) as up:
        yield up


def test_benchmark_recommendations_fill_only_unset_options() -> None:
    cfg, applied = apply_benchmark_defaults(load_config(None, benchmark="yesno", lr=1e-5), ShortAnswers())
    assert applied == {"max_tokens": 5}  # lr was given; unknown names are ignored
    assert cfg.max_tokens == 5 and cfg.lr == 1e-5
    saved = TrainConfig.model_validate(load_config(None).model_dump())  # a resumed run: every option set
    assert apply_benchmark_defaults(saved, ShortAnswers()) == (saved, {})
    assert apply_benchmark_defaults(cfg, YesNoBenchmark()) == (cfg, {})  # no recommendations


def test_recommendations_reach_the_run_and_its_config(tmp_path: Path, upstream: FakeUpstream) -> None:
    cfg = load_config(None, benchmark="yesno", batch_size=2, group_size=2, max_steps=1, eval_examples=0,
                      output=str(tmp_path / "run"))
    console = Console(record=True, width=200)
    train(cfg, backend=RecordingBackend(upstream.base_url), benchmark=ShortAnswers(), progress=False,
          console=console)
    assert load_config(tmp_path / "run" / "config.yaml").max_tokens == 5
    text = console.export_text()
    assert "recommended settings: max_tokens=5, lr=3e-06" in text
    assert "step    1  reward 0.500  acc 0.50" in text  # the step line stays on screen without the bar


def test_a_fresh_run_refuses_a_used_run_directory(tmp_path: Path, upstream: FakeUpstream) -> None:
    cfg = load_config(None, benchmark="yesno", batch_size=2, group_size=2, max_steps=1, eval_examples=0,
                      output=str(tmp_path / "run"))
    quiet = Console(quiet=True)
    train(cfg, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), progress=False,
          console=quiet)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match=r"already holds a training run: continue it with `rllm train --resume"):
        train(cfg, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), progress=False,
              console=quiet)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before  # nothing mixed in
    assert RunDir(tmp_path / "run").holds_run() and not RunDir(tmp_path / "other").holds_run()


def _episode(*steps: Step, error: str | None = None) -> Episode:
    return Episode(task=Task(id="t"), trajectories=[Trajectory(steps=list(steps))], error=error)


def test_skip_reason_says_why_nothing_was_trainable() -> None:
    no_ids = Step(text="4")
    errored = Step(text="", error="upstream 500")
    retok = Step(prompt_token_ids=[1], completion_token_ids=[2], token_source="retokenized")  # no logprobs
    why = _skip_reason([_episode(no_ids, errored), _episode(retok)], [], [])
    assert "among 3 LLM calls: 1 errored, 1 without token ids" in why and "1 without logprobs" in why
    why = _skip_reason([_episode(error="boom"), _episode()], [], [])
    assert "no LLM calls were recorded" in why and "1 of 2 episodes errored" in why


def test_display_lines() -> None:
    m: dict[str, Any] = {"reward/mean": 0.25, "reward/accuracy": 0.25, "episode/response_tokens_mean": 9.6,
                         "train/approx_kl": 0.0012, "train/clip_frac": 0.1, "train/entropy": 1.5,
                         "train/grad_norm": 0.8, "time/step_s": 12.0, "time/rollout_s": 5.0, "time/train_s": 6.5}
    assert step_line(3, m) == ("step    3  reward 0.250  acc 0.25  len 10  kl +0.0012  clip 0.100  ent 1.50  "
                               "gnorm 0.80  12.0s (rollout 5.0 train 6.5)")
    unmeasured = {k: v for k, v in m.items() if k not in ("train/entropy", "train/grad_norm")}  # e.g. Tinker's
    assert step_line(3, unmeasured) == ("step    3  reward 0.250  acc 0.25  len 10  kl +0.0012  clip 0.100  "
                                        "12.0s (rollout 5.0 train 6.5)")
    assert "skipped[/yellow]: no rows" in step_line(4, {"skipped": "no rows"})
    ev = {"val/reward/accuracy": 0.5, "val/reward/mean": 0.5, "val_greedy/reward/accuracy": 0.75,
          "val/episode/count": 8.0, "time/eval_s": 4.0}
    assert eval_line(10, ev) == ("[bold]eval[/bold]   10  sampled acc 0.500  reward 0.500  greedy acc 0.750  "
                                 "(8 episodes, 4.0s)")


def test_cli_options_are_documented_and_maps_stay_in_files(tmp_path: Path) -> None:
    res = CliRunner().invoke(build_app(), ["train", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "--group-size" in res.output and "ppo | importance_sampling | gspo" in res.output
    assert "--backend-options" not in res.output  # a mapping: YAML/TOML only
    f = tmp_path / "train.yaml"
    f.write_text("backend: local\nbackend_options:\n  tensor_parallel: 2\n  extra: {a: 1}\n")
    assert load_config(f).backend_options == {"tensor_parallel": 2, "extra": {"a": 1}}


def test_error_record_written_when_training_stops(tmp_path: Path, upstream: FakeUpstream) -> None:
    from rllm_core.errors import TrainingError

    cfg = load_config(None, benchmark="yesno", batch_size=2, group_size=2, max_steps=3, eval_examples=0,
                      output=str(tmp_path / "run"))
    with pytest.raises(TrainingError):
        train(cfg, backend=RecordingBackend(upstream.base_url, fail_at_step=2), benchmark=YesNoBenchmark(),
              progress=False, console=Console(quiet=True))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records] == [("train", 1), ("error", 2)]
    assert "NaN" in records[-1]["error"]


AGENT = '''
import httpx

import rllm


@rllm.rollout
def solve(task, config):
    """Asks the model and scores itself: the benchmark has no reward (workflow none)."""
    body = {"model": config.model, "messages": [{"role": "user", "content": task.instruction}], **config.sampling}
    auth = {"Authorization": f"Bearer {config.api_key}"}  # the run's gateway token
    text = httpx.post(f"{config.base_url}/chat/completions", json=body, headers=auth,
                      timeout=30).json()["choices"][0]["message"]
    return {"answer": text["content"], "reward": 1.0 if "yes" in text["content"] else 0.0}
'''


def test_own_agent_with_workflow_none_scores_itself(tmp_path: Path, upstream: FakeUpstream,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "selfscored_agent.py").write_text(AGENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, benchmark="yesno", agent="selfscored_agent:solve", workflow="none", batch_size=2,
                      group_size=2, max_steps=1, eval_examples=0, output=str(tmp_path / "run"))
    backend = RecordingBackend(upstream.base_url)
    result = train(cfg, backend=backend, benchmark=YesNoBenchmark(reward=""), progress=False,
                   console=Console(quiet=True))  # no reward function: fine, the agent scores itself
    m = result.history[0]
    assert m["reward/mean"] == pytest.approx(0.5) and m["reason/agent_reward"] == 1.0
    trained = {a for r in backend.batches[0] for a, k in zip(r.advantages, r.loss_mask, strict=True) if k}
    assert len(trained) == 2 and min(trained) < 0 < max(trained)  # one yes and one no per group
