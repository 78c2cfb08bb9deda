"""On-policy distillation (`rllm train --teacher`): the teacher's term of the advantage is logπ_T − logπ_S on
trained tokens only; a teacher equal to the student gives zero (through the real policy server's sampled
logprobs, in a training step), a teacher trained on the student's tokens gives them a positive advantage; a
vLLM-style prompt_logprobs server scores exactly as the local forward; teacher calls are recorded apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from rllm_core.errors import ConfigError, TrainingError
from rllm_serve.models import load_model
from rllm_testing.prompt_logprobs_server import start_prompt_logprobs_server
from rllm_testing.training import YesNoBenchmark, yesno_config
from rllm_train.distill import HttpTeacher, LocalTeacher, distill_rows, make_teacher
from rllm_train.loop import train
from rllm_train.packing import TrainRow
from rllm_train.sft import SftConfig, load_sft_rows, sft


def _row(tokens: list[int], mask: list[int], sampled: list[float], advantage: float) -> TrainRow:
    return TrainRow(tokens=tokens, loss_mask=mask, sampling_logprobs=sampled,
                    advantages=[advantage * m for m in mask])


def test_the_teacher_term_is_the_log_ratio_on_trained_tokens_only() -> None:
    row = _row([5, 6, 7, 8], [0, 1, 0, 1], [0.0, -1.0, 0.0, -2.0], 0.5)
    [out], metrics = distill_rows([row], [[0.0, -0.5, -9.0, -3.0]], teacher_coef=2.0, task_coef=1.0)
    assert out.advantages == [0.0, 0.5 + 2 * 0.5, 0.0, 0.5 + 2 * -1.0]  # likelier for the teacher: pushed up
    assert metrics["distill/reverse_kl"] == pytest.approx((-0.5 + 1.0) / 2) and metrics["distill/tokens"] == 2
    [pure], _ = distill_rows([row], [[0.0, -1.0, 0.0, -2.0]], teacher_coef=1.0, task_coef=0.0)
    assert pure.advantages == [0.0] * 4  # the teacher agrees with the student: nothing to learn
    with pytest.raises(TrainingError, match="scored 3 tokens"):
        distill_rows([row], [[0.0, 0.0, 0.0]], 1.0)


def test_a_teacher_trained_on_the_students_tokens_pushes_them_up(tmp_path: Path) -> None:
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "Say the code."},
                                             {"role": "assistant", "content": "The code is zebra forty two."}]}) + "\n")
    config = SftConfig(data=[str(chat)], model="tiny-random", output=str(tmp_path / "teacher"), epochs=6, lr=3e-3,
                       batch_size=1)
    sft(config, progress=False, console=Console(quiet=True))
    [row], _ = load_sft_rows(config)
    student = LocalTeacher("tiny-random")
    row = row.model_copy(update={"sampling_logprobs": student.logprobs([row])[0]})
    [same], _ = distill_rows([row], student.logprobs([row]), 1.0, task_coef=0.0)
    assert same.advantages == [0.0] * len(row.tokens)
    [pushed], metrics = distill_rows([row], LocalTeacher(str(tmp_path / "teacher")).logprobs([row]), 1.0, 0.0)
    trained = [a for a, m in zip(pushed.advantages, row.loss_mask, strict=True) if m]
    assert sum(trained) > 0 and sum(a > 0 for a in trained) > len(trained) / 2 and metrics["distill/reverse_kl"] < 0


def test_a_prompt_logprobs_server_scores_as_the_local_forward() -> None:
    loaded = load_model("tiny-random")
    row = _row(list(range(3, 40)), [0] * 10 + [1] * 27, [0.0] * 37, 1.0)
    local = LocalTeacher("tiny-random").logprobs([row])[0]
    with start_prompt_logprobs_server(loaded.model, loaded.tokenizer) as server:
        teacher = make_teacher(server.url)  # URL alone: the server's one model
        assert isinstance(teacher, HttpTeacher) and teacher.model == "teacher"
        remote = teacher.logprobs([row])[0]
        assert make_teacher(f"teacher@{server.url}").logprobs([row])[0] == remote
        with pytest.raises(TrainingError, match="HTTP 400"):
            HttpTeacher(server.url, "other").logprobs([row])
    assert remote == pytest.approx(local, abs=1e-5) and server.requests == 3
    with pytest.raises(ConfigError, match="could not list its models"):
        make_teacher("http://127.0.0.1:9/v1")


def test_a_training_step_with_the_student_as_teacher_has_no_reverse_kl(tmp_path: Path) -> None:
    """The policy server's sampled logprobs (fp32) against a fresh forward of the same weights: the teacher's term
    is ~0, the step trains, and the teacher's calls are in teacher.jsonl, not among the Steps."""
    config = yesno_config(tmp_path, model="tiny-random", max_steps=1, eval_examples=0, teacher="tiny-random",
                          task_coef=0.0, temperature=1.0)
    result = train(config, benchmark=YesNoBenchmark(), progress=False, console=Console(quiet=True))
    [metrics] = result.history
    assert abs(metrics["distill/reverse_kl"]) < 1e-4 and metrics["distill/tokens"] > 0
    [record] = [json.loads(line) for line in (result.run_dir / "teacher.jsonl").read_text().splitlines()]
    assert record["teacher"] == "tiny-random" and record["step"] == 1 and record["distill/rows"] > 0
    assert "teacher" not in {s.get("agent") for line in (result.run_dir / "episodes" / "step_1.jsonl").open()
                             for t in json.loads(line)["trajectories"] for s in t["steps"]}


def test_distillation_runs_on_the_tinker_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Tinker backend takes the per-token advantages as they are: a step with the student as its own teacher
    trains with a reverse KL of ~0 (the double samples the same weights in fp32)."""
    from rllm_backends.tinker import retry

    monkeypatch.setenv("RLLM_TINKER_SERVICE", "rllm_backends.tinker.double:service_double_from_env")
    monkeypatch.setenv("RLLM_TINKER_DOUBLE_DIR", str(tmp_path / "service"))
    monkeypatch.setattr(retry, "RETRY_WAIT_S", 0.01)
    config = yesno_config(tmp_path, model="tiny-random", backend="tinker", lora_rank=8, max_steps=1,
                          eval_examples=0, teacher="tiny-random", task_coef=0.0)
    result = train(config, benchmark=YesNoBenchmark(), progress=False, console=Console(quiet=True))
    [metrics] = result.history
    assert abs(metrics["distill/reverse_kl"]) < 1e-3 and metrics["distill/tokens"] > 0
