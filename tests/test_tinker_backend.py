"""The tinker backend end to end against the in-process SDK double: rollout → rows → forward_backward →
optim_step → new sampling client → next rollout, save and resume, eval from a run, and the failures a user meets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rllm_backends.tinker import retry
from rllm_backends.tinker.backend import STATE_FILE, TinkerBackend
from rllm_backends.tinker.double import ServiceDouble
from rllm_core.errors import ConfigError, TrainingError
from rllm_core.rewards import RewardResult
from rllm_core.runs.checkpoints import latest_checkpoint
from rllm_core.types import Task
from rllm_testing.backend_contract import BackendContract
from rllm_testing.training import YesNoBenchmark
from rllm_train.config import TrainConfig
from rllm_train.loop import train
from rllm_train.rundir import RunDir

SERVICE = "rllm_backends.tinker.double:service_double_from_env"


class EvenLength(YesNoBenchmark):
    """Rewards a tiny random model can earn: 1 when the reply has an even number of characters."""

    def grade(self, task: Task, response: str) -> RewardResult:
        if len(response) % 2 == 0:
            return RewardResult.correct(extracted=response[:20])
        return RewardResult.fail("wrong_answer", extracted=response[:20])


@pytest.fixture
def double_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "service"
    monkeypatch.setenv("RLLM_TINKER_SERVICE", SERVICE)
    monkeypatch.setenv("RLLM_TINKER_DOUBLE_DIR", str(root))
    monkeypatch.setattr(retry, "RETRY_WAIT_S", 0.01)
    return root


def _config(tmp_path: Path, **kw: object) -> TrainConfig:
    base: dict[str, object] = {"benchmark": "yesno", "backend": "tinker", "model": "tiny-random", "lora_rank": 8,
                               "batch_size": 2, "group_size": 2, "max_steps": 2, "save_every": 10,
                               "eval_examples": 0, "output": str(tmp_path / "run"), "max_tokens": 8,
                               "concurrency": 4, "lr": 1e-3, "seed": 3}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def _train(config: TrainConfig, **kw: object) -> object:
    return train(config, benchmark=EvenLength(), progress=False, console=Console(quiet=True), **kw)


def test_train_loop_runs_on_the_service_and_resumes(tmp_path: Path, double_env: Path) -> None:
    result = _train(_config(tmp_path))
    run = RunDir(result.run_dir)
    metrics = [m for m in run.read_metrics() if m["kind"] == "train"]
    assert [m["policy_version"] for m in metrics] == [1, 2]
    assert all(m["train/trained_tokens"] > 0 for m in metrics)
    # rollouts were sampled by the service (token ids and logprobs from its samples), one new client per sync
    steps = [s for line in (result.run_dir / "episodes" / "step_2.jsonl").open()
             for t in json.loads(line)["trajectories"] for s in t["steps"]]
    assert steps and all(s["token_source"] == "server" and s["completion_token_ids"] for s in steps)
    assert {s["policy_version"] for s in steps} == {1}
    ckpt = latest_checkpoint(result.run_dir / "checkpoints")
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["state_path"].startswith("tinker://") and state["sampler_path"].startswith("tinker://")
    assert state["policy_version"] == 2 and state["lora_rank"] == 8
    # --resume in a new "process": a new service double over the same storage continues from step 2
    resumed = _train(_config(tmp_path, max_steps=3), resume=True)
    assert resumed.steps_done == 3
    assert [m["policy_version"] for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"] == [1, 2, 3]


def test_async_rollouts_sample_the_previous_sampler_while_the_service_updates(tmp_path: Path,
                                                                              double_env: Path) -> None:
    """--max-staleness 1 on Tinker: the next step's episodes sample from the sampling client of the weights before
    the update in flight (forward_backward/optim_step), one version behind; nothing dropped, every step trained."""
    result = _train(_config(tmp_path, max_steps=3, max_staleness=1))
    metrics = [m for m in RunDir(result.run_dir).read_metrics() if m["kind"] == "train"]
    assert [m["policy_version"] for m in metrics] == [1, 2, 3]
    assert all(m["async/stale_dropped"] == 0 and m["async/staleness_max"] <= 1 for m in metrics)
    assert all(m["train/trained_tokens"] > 0 for m in metrics)
    for step in (2, 3):  # each step's calls began before the previous step's update was synced and logged
        calls = [s for line in (result.run_dir / "episodes" / f"step_{step}.jsonl").open()
                 for t in json.loads(line)["trajectories"] for s in t["steps"]]
        assert calls and min(s["started_at"] for s in calls) < metrics[step - 2]["time"]
        assert {s["policy_version"] for s in calls} <= {step - 2, step - 1}


def _logprobs(backend: TinkerBackend, tokens: list[int]) -> list[float | None]:
    import tinker

    client = backend.training.save_weights_and_get_sampling_client().result()
    return client.compute_logprobs(tinker.types.ModelInput.from_ints(tokens)).result()


def test_weights_move_and_the_sampler_follows(tmp_path: Path, double_env: Path) -> None:
    from rllm_testing.backend_contract import sample_rows

    config = _config(tmp_path)
    backend = TinkerBackend(config)
    backend.setup(config)
    try:
        rows = sample_rows(backend, n=4, max_tokens=8)
        before = _logprobs(backend, rows[0].tokens)
        metrics = TestTinkerContract._step(backend, rows)
        assert metrics["train/trained_tokens"] == sum(sum(r.loss_mask[1:]) for r in rows)
        assert _logprobs(backend, rows[0].tokens) != before, "an update with lr 1e-3 must move the weights"
        assert backend.sync_weights() == 1
        assert sample_rows(backend, n=1, max_tokens=8)[0].policy_version == 1
    finally:
        backend.shutdown()


PROBE = [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize(("loss", "method"), [("importance_sampling", "forward_backward"),
                                              ("ppo", "forward_backward_custom"), ("ppo", "optim_step"),
                                              ("ppo", "save_state")])
def test_a_transient_failure_retries_the_step_from_its_snapshot(tmp_path: Path, double_env: Path, loss: str,
                                                                method: str) -> None:
    """The retried step leaves exactly the weights a step without the failure leaves (never two updates)."""
    from rllm_testing.backend_contract import sample_rows

    twins = []
    for name in ("clean", "faulty", "untrained"):
        config = _config(tmp_path / name, max_steps=1, loss=loss)
        backend = TinkerBackend(config)
        backend.setup(config)
        backend.policy_endpoint()  # its training client and first snapshot exist before any fault starts
        twins.append(backend)
    clean, faulty, untrained = twins
    try:
        rows = sample_rows(clean, n=2, max_tokens=8)
        TestTinkerContract._step(clean, rows)
        faulty.service.faults.add(method, 2, "server")
        metrics = TestTinkerContract._step(faulty, rows)
        assert len(faulty.service.faults.raised) == 2 and metrics["tinker/tries"] == 3
        assert _logprobs(faulty, PROBE) == pytest.approx(_logprobs(clean, PROBE), abs=1e-6)
        assert _logprobs(faulty, PROBE) != _logprobs(untrained, PROBE), "the step must have trained"
    finally:
        for b in twins:
            b.shutdown()


def test_a_service_down_mid_run_stops_with_a_checkpoint_of_the_last_step(tmp_path: Path, double_env: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real_step = TinkerBackend.train_step
    after_step_2: list[list[float | None]] = []

    def fail_from_step_3(self: TinkerBackend, rows: list) -> object:
        if self.steps_done == 2 and not after_step_2:
            after_step_2.append(_logprobs(self, PROBE))
            self.service.faults.add("forward_backward_custom", 100, "server")
        return real_step(self, rows)

    monkeypatch.setattr(TinkerBackend, "train_step", fail_from_step_3)
    with pytest.raises(TrainingError, match=r"stopped at step 3: .*forward_backward_custom after 4 tries.* last good "
                                            r"checkpoint is .*step_2"):
        _train(_config(tmp_path, max_steps=4))
    ckpt = json.loads((latest_checkpoint(tmp_path / "run" / "checkpoints") / STATE_FILE).read_text())
    assert ckpt["steps_done"] == 2
    import tinker

    sampler = ServiceDouble(double_env).create_sampling_client(model_path=ckpt["sampler_path"]).result()
    saved = sampler.compute_logprobs(tinker.types.ModelInput.from_ints(PROBE)).result()
    assert saved == pytest.approx(after_step_2[0], abs=1e-6), "the rescue checkpoint must hold step 2's weights"
    monkeypatch.setattr(TinkerBackend, "train_step", real_step)
    resumed = _train(_config(tmp_path, max_steps=4), resume=True)
    assert resumed.steps_done == 4


def test_eval_samples_from_a_trained_run(tmp_path: Path, double_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm.cli.app import build_app  # the CLI as a user runs it
    from rllm_backends.tinker import double

    _train(_config(tmp_path, max_steps=1))
    made: list[ServiceDouble] = []
    real_factory = double.service_double_from_env

    def recording_factory() -> ServiceDouble:
        made.append(real_factory())
        return made[-1]

    monkeypatch.setattr(double, "service_double_from_env", recording_factory)
    out = CliRunner().invoke(build_app(), ["eval", "arithmetic", "--backend", "tinker", "--model",
                                   str(tmp_path / "run"), "-n", "2", "--max-tokens", "8", "--no-progress",
                                   "-o", str(tmp_path / "eval")])
    assert out.exit_code == 0, out.output
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["n_episodes"] == 2
    ckpt = json.loads((latest_checkpoint(tmp_path / "run" / "checkpoints") / STATE_FILE).read_text())
    opened = [e.request for e in made[0].log if e.method == "create_sampling_client"]
    assert opened == [{"model_path": ckpt["sampler_path"], "base_model": None}], "eval must sample the run's weights"


# ---------------------------------------------------------------------------------------------- bad input
def test_no_api_key_is_one_line_naming_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLLM_TINKER_SERVICE", raising=False)
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"export TINKER_API_KEY="):
        _train(_config(tmp_path))
    assert not (tmp_path / "run").exists(), "nothing may be written before the key is checked"


def test_missing_sdk_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "tinker":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(ConfigError, match=r'pip install "rllm\[tinker\]"'):
        TinkerBackend(_config(tmp_path))


def test_unsupported_base_model_lists_the_services_models(tmp_path: Path, double_env: Path) -> None:
    with pytest.raises(ConfigError, match=r"'Qwen/Nope' is not a base model .* offers: tiny-random"):
        _train(_config(tmp_path, model="Qwen/Nope"))


def test_unsupported_lora_rank_gives_the_services_message(tmp_path: Path, double_env: Path) -> None:
    with pytest.raises(ConfigError, match=r"refused a LoRA run .* rank 3: .*rank"):
        _train(_config(tmp_path, lora_rank=3))


def test_a_loss_tinker_cannot_express_is_refused_by_name(tmp_path: Path, double_env: Path) -> None:
    with pytest.raises(ConfigError, match="loss_fn"):
        _train(_config(tmp_path, backend_options={"tinker": {"loss_fn": "no-such-loss"}}))


class TestTinkerContract(BackendContract):
    """rllm's backend contract suite, passed by the tinker backend against the SDK double."""

    @pytest.fixture(autouse=True)
    def _service(self, double_env: Path) -> None:
        return None

    def make_backend(self, tmp_path: Path) -> tuple[TinkerBackend, TrainConfig]:
        config = _config(tmp_path, max_steps=4)
        return TinkerBackend(config), config
