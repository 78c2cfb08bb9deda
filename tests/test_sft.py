"""`rllm sft`: rows from chat data and from curated episodes masked exactly (assistant tokens only, checked token by
token on a multi-turn tool conversation), the sft loss is the assistant tokens' NLL, a memorisation case drives
it down on the local backend and on the Tinker double (its built-in cross_entropy), `rllm train --init RUN` loads
the SFT checkpoint with the same logprobs, and bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_backends.tinker import retry
from rllm_core.errors import ConfigError
from rllm_core.runs.episodes import write_episodes
from rllm_core.types import Episode, Step, Task, Trajectory
from rllm_serve.models import load_model, load_tokenizer
from rllm_train.algorithms.losses import policy_loss_with_metrics
from rllm_train.config import TrainConfig
from rllm_train.packing import pack_trajectory
from rllm_train.setup import resolve_init
from rllm_train.sft import SftConfig, load_sft_rows, sft, sft_batches
from rllm_train.sft_data import EpisodeFilter, chat_trajectory, sft_rows_from_episodes

TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search the passages.",
                                           "parameters": {"type": "object", "properties": {
                                               "query": {"type": "string"}}, "required": ["query"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You answer with the search tool."},
    {"role": "user", "content": "Who played Corliss Archer?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "search", "arguments": json.dumps({"query": "Corliss Archer"})}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "[d1] Kiss and Tell: Shirley Temple as Corliss Archer."},
    {"role": "assistant", "content": "Shirley Temple."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You are welcome."},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("tiny-random")


def _spans(tokens: list[int], mask: list[int]) -> list[list[int]]:
    spans: list[list[int]] = []
    for i, (t, m) in enumerate(zip(tokens, mask, strict=True)):
        if m and (i == 0 or not mask[i - 1]):
            spans.append([])
        if m:
            spans[-1].append(t)
    return spans


def test_a_multi_turn_tool_conversation_is_one_row_with_only_the_assistant_tokens_trained(tokenizer: Any) -> None:
    eot = frozenset({tokenizer.eos_token_id})
    trajectory = chat_trajectory(CONVERSATION, tokenizer, tools=TOOLS, end_of_turn_ids=eot)
    assert len(trajectory.steps) == 3
    [row], counts = pack_trajectory(trajectory, 1.0)
    assert counts["rows_split"] == 0  # every turn extends the one before: one row, as an RL trajectory is
    # the whole row is the rendering of the whole conversation (tools in the Hermes convention)
    full = tokenizer.apply_chat_template(_hermes(CONVERSATION), tokenize=False)
    assert tokenizer.decode(row.tokens) == full.removesuffix("\n")
    spans = [tokenizer.decode(s) for s in _spans(row.tokens, row.loss_mask)]
    end = tokenizer.decode([tokenizer.eos_token_id])
    call = json.dumps({"name": "search", "arguments": {"query": "Corliss Archer"}})
    assert spans == [f"<tool_call>\n{call}\n</tool_call>{end}", f"Shirley Temple.{end}", f"You are welcome.{end}"]
    # token by token: a trained token is exactly one of an assistant turn's completion tokens, in order
    completions = [t for step in trajectory.steps for t in step.completion_token_ids or []]
    assert [t for t, m in zip(row.tokens, row.loss_mask, strict=True) if m] == completions
    untrained = tokenizer.decode([t for t, m in zip(row.tokens, row.loss_mask, strict=True) if not m])
    assert "Shirley Temple as Corliss Archer" in untrained and "Thanks!" in untrained  # tool result, user: masked


def _hermes(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from rllm_serve.tool_prompt import content_text, tools_in_messages

    return [{**m, "content": content_text(m.get("content"))} for m in tools_in_messages(messages, TOOLS)]


def _write_chat(path: Path, conversations: list[list[dict[str, Any]]]) -> Path:
    path.write_text("".join(json.dumps({"messages": c, "tools": TOOLS}) + "\n" for c in conversations))
    return path


def test_the_sft_loss_is_the_negative_log_likelihood_of_the_trained_tokens() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    loss, metrics = policy_loss_with_metrics("sft", logp, torch.zeros_like(logp), torch.ones(2), mask)
    assert loss.item() == pytest.approx(-(logp * mask).sum().item() / 4) and metrics["clip_frac"] == 0.0


def _episode(reward: float, reason: str, turns: int, name: str = "solver", benchmark: str = "math") -> Episode:
    steps, prompt = [], [1, 2, 3]
    for k in range(turns):
        completion = [10 + k, 11 + k]
        steps.append(Step(prompt_token_ids=list(prompt), completion_token_ids=completion, logprobs=[-0.5, -0.7],
                          token_source="server"))
        prompt = prompt + completion + [4, 5]  # an observation between turns
    return Episode(task=Task(id=f"t{turns}", benchmark=benchmark), trajectories=[Trajectory(name=name, steps=steps)],
                   reward=reward, reward_reason=reason)


def test_episodes_are_kept_by_reward_reason_benchmark_role_and_a_predicate(tmp_path: Path) -> None:
    run = tmp_path / "eval-run"
    run.mkdir()
    write_episodes(run / "episodes.jsonl", [_episode(1.0, "correct", 2), _episode(0.0, "wrong_answer", 1),
                                            _episode(1.0, "correct", 3, name="judge"),
                                            _episode(1.0, "correct", 1, benchmark="gsm8k")])
    rows, counts = sft_rows_from_episodes(run, EpisodeFilter(min_reward=1.0))
    assert counts["episodes_read"] == 4 and counts["episodes_kept"] == 3 and len(rows) == 3
    [row] = sft_rows_from_episodes(run, EpisodeFilter(reasons=["correct"], roles=["solver"],
                                                      benchmarks=["math"]))[0]
    assert row.tokens == [1, 2, 3, 10, 11, 4, 5, 11, 12] and row.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert row.advantages == row.loss_mask and row.temperature == 1.0
    kept = sft_rows_from_episodes(run, EpisodeFilter(where="len(episode.steps) >= 3"))[0]
    assert [r.role for r in kept] == ["judge"]
    with pytest.raises(ConfigError, match="--where"):
        sft_rows_from_episodes(run, EpisodeFilter(where="len(episode.steps >"))
    with pytest.raises(ConfigError, match="holds no episodes"):
        sft_rows_from_episodes(tmp_path, EpisodeFilter())


def test_batches_cover_every_row_once_per_epoch() -> None:
    rows = list(range(10))
    epoch = [r for step in (1, 2, 3) for r in sft_batches(rows, 4, 0, step)]  # type: ignore[arg-type]
    assert sorted(epoch) == rows and len(sft_batches(rows, 4, 0, 3)) == 2  # type: ignore[arg-type]
    assert sft_batches(rows, 4, 0, 4) != sft_batches(rows, 4, 1, 4)  # type: ignore[arg-type]


def _memorise(tmp_path: Path, **kw: Any) -> tuple[Any, SftConfig]:
    chat = _write_chat(tmp_path / "chat.jsonl", [CONVERSATION, [{"role": "user", "content": "2+2?"},
                                                                {"role": "assistant", "content": "4"}]])
    config = SftConfig(data=[str(chat)], model="tiny-random", output=str(tmp_path / "sft"), batch_size=2, epochs=8,
                       lr=3e-3, **kw)
    return sft(config, progress=False, console=Console(quiet=True)), config


def test_sft_memorises_on_the_local_backend_and_train_init_loads_the_same_weights(tmp_path: Path) -> None:
    result, config = _memorise(tmp_path)
    nll = [m["train/pg_loss"] for m in result.history]
    assert len(nll) == 8 and nll[-1] < 0.5 * nll[0], nll
    assert result.counts["conversations"] == 2 and result.last_checkpoint is not None
    train_config = resolve_init(TrainConfig(init=str(result.run_dir), output=str(tmp_path / "rl")))
    assert train_config.model == str(result.last_checkpoint) and train_config.init == str(result.run_dir)
    rows, _ = load_sft_rows(config)
    tokens = torch.tensor([rows[0].tokens])
    sft_model = load_model(str(result.run_dir)).model
    init_model = load_model(train_config.model).model
    base = load_model("tiny-random").model
    with torch.no_grad():
        same = torch.equal(sft_model(tokens).logits, init_model(tokens).logits)
        moved = not torch.allclose(sft_model(tokens).logits, base(tokens).logits)
    assert same and moved


def test_sft_trains_a_lora_adapter_per_role(tmp_path: Path) -> None:
    result, _ = _memorise(tmp_path, roles="sft=lora:student", lora_rank=4)
    nll = [m["train/pg_loss"] for m in result.history]
    assert nll[-1] < nll[0] and result.history[-1]["train/adapter/student/rows"] > 0
    assert (result.last_checkpoint / "adapters" / "student" / "adapter_config.json").is_file()


def test_sft_runs_on_the_tinker_double_through_its_cross_entropy(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLLM_TINKER_SERVICE", "rllm_backends.tinker.double:service_double_from_env")
    monkeypatch.setenv("RLLM_TINKER_DOUBLE_DIR", str(tmp_path / "service"))
    monkeypatch.setattr(retry, "RETRY_WAIT_S", 0.01)
    from rllm_backends.tinker.losses import plan_loss

    assert plan_loss(TrainConfig(loss="sft")).loss_fn == "cross_entropy"
    result, _ = _memorise(tmp_path, backend="tinker", lora_rank=8)
    nll = [m["train/pg_loss"] for m in result.history]
    assert nll[-1] < 0.5 * nll[0], nll


def test_init_is_refused_on_tinker_and_for_what_holds_no_model() -> None:
    with pytest.raises(ConfigError, match="tinker backend trains a model Tinker hosts"):
        resolve_init(TrainConfig(init="runs/x", backend="tinker"))
    with pytest.raises(ConfigError, match="not a run of rllm sft"):
        resolve_init(TrainConfig(init="/nonexistent/run"))


def test_the_cli_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": "hello"}) + "\n")
    out = CliRunner().invoke(build_app(), ["sft", str(bad), "--model", "tiny-random", "-o", str(tmp_path / "o")])
    assert out.exit_code == 1 and "bad.jsonl:1" in out.output and "Traceback" not in out.output
    run = tmp_path / "none"
    run.mkdir()
    write_episodes(run / "episodes.jsonl", [_episode(0.0, "wrong_answer", 1)])
    out = CliRunner().invoke(build_app(), ["sft", str(run), "--min-reward", "1", "-o", str(tmp_path / "o2")])
    assert out.exit_code == 1 and "passed the filters" in out.output
