"""`rllm train --workflow solver-judge|refinement|self-debate`: each trained end to end on tiny-random, per-role
estimators and reward weights reaching the rows, per-role metrics, the gateway sending each role's calls with
its policy's model name, and the errors for per-role options that name no role of the workflow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from rllm_core.errors import ConfigError
from rllm_core.types import Trajectory, TrajectoryGroup
from rllm_rollout.chat import chat, make_client
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_rollout.rollout import rollout
from rllm_testing.fake_upstream import FakeUpstream, start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_testing.training import YesNoBenchmark, alternating_responder, yesno_config
from rllm_train.config import load_config
from rllm_train.loop import train
from rllm_train.roles import weigh_advantages
from rllm_train.rundir import RunDir

ROLES = {"solver-judge": {"solver", "judge"}, "refinement": {"solver", "critic"},
         "self-debate": {"debater", "moderator"}}


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with start_fake_upstream(alternating_responder()) as up:
        yield up


@pytest.mark.slow
@pytest.mark.parametrize("workflow", sorted(ROLES))
def test_each_workflow_trains_two_steps_on_tiny_random(tmp_path: Path, workflow: str) -> None:
    """The real local backend (torch trainer + policy server): every role's calls become rows, every role gets
    its own metrics in the train and eval records."""
    config = load_config(None, benchmark="arithmetic", model="tiny-random", workflow=workflow, batch_size=2,
                         group_size=2, max_steps=2, max_tokens=6, eval_examples=2, concurrency=8, lr=1e-4,
                         output=str(tmp_path / "run"), save_every=2, bf16=False, eval_every=0)
    result = train(config, progress=False)
    records = RunDir(result.run_dir).read_metrics()
    trains = [m for m in records if m["kind"] == "train"]
    assert [m["step"] for m in trains] == [1, 2]
    for role in ROLES[workflow]:
        assert {f"role/{role}/reward_mean", f"role/{role}/accuracy", f"role/{role}/llm_calls_mean"} <= set(trains[0])
        assert trains[0][f"role/{role}/llm_calls_mean"] >= 1
        assert f"val/role/{role}/accuracy" in records[-1]
    assert all(m.get("pack/rows", 0) > 0 for m in trains)
    episodes = RunDir(result.run_dir).episodes_dir / "step_1.jsonl"
    assert episodes.is_file()


def test_role_weights_scale_each_roles_advantages(tmp_path: Path, upstream: FakeUpstream) -> None:
    """solver-judge on the yes/no double: solvers alternate yes/no (mixed groups); `--role-weights solver=0.5`
    halves exactly the solver rows' advantages, and every row carries its role."""
    def solver_advantages(**overrides: object) -> tuple[list[float], set[str]]:
        backend = RecordingBackend(upstream.base_url)
        cfg = yesno_config(tmp_path / str(len(overrides)), workflow="solver-judge", max_steps=1, eval_examples=0,
                           **overrides)
        train(cfg, backend=backend, benchmark=YesNoBenchmark(), progress=False)
        rows = backend.batches[0]
        advs = sorted(a for r in rows if r.role == "solver" for a, m in zip(r.advantages, r.loss_mask, strict=True)
                      if m)
        return advs, {r.role for r in rows}

    plain, roles = solver_advantages()
    weighted, _ = solver_advantages(role_weights="solver=0.5")
    assert roles == {"solver", "judge"}
    assert any(a != 0 for a in plain)
    assert weighted == pytest.approx([a * 0.5 for a in plain])


def test_weigh_advantages_defaults_to_one_and_star() -> None:
    groups = [TrajectoryGroup(group_id="g", task_id="t", role=role, trajectories=[Trajectory(id=role, name=role)])
              for role in ("solver", "judge", "critic")]
    advantages = {"solver": 1.0, "judge": 2.0, "critic": 3.0}
    assert weigh_advantages(advantages, groups, {}) == advantages
    assert weigh_advantages(advantages, groups, {"judge": 0.0}) == {"solver": 1.0, "judge": 0.0, "critic": 3.0}
    assert weigh_advantages(advantages, groups, {"solver": 2.0, "*": 0.5}) == {"solver": 2.0, "judge": 1.0,
                                                                               "critic": 1.5}


@pytest.mark.parametrize(("option", "value"), [("algo", "solvr=grpo,judge=reinforce"), ("roles", "jdge=lora:j"),
                                               ("role_weights", "critic=0.5")])
def test_an_unknown_role_lists_the_workflows_roles(tmp_path: Path, upstream: FakeUpstream, option: str,
                                                   value: str) -> None:
    cfg = yesno_config(tmp_path, workflow="solver-judge", **{option: value})
    backend = RecordingBackend(upstream.base_url)
    with pytest.raises(ConfigError, match=r"has no role .*; its roles are judge, solver") as err:
        train(cfg, backend=backend, benchmark=YesNoBenchmark(), progress=False)
    flag = {"algo": "--estimator", "roles": "--roles", "role_weights": "--role-weights"}[option]
    assert str(err.value).startswith(f"{flag}: workflow 'solver_judge'")
    assert backend.events == []  # refused before the backend was even set up


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    from rllm.cli.app import build_app

    runner, app = CliRunner(), build_app()
    out = runner.invoke(app, ["train", "arithmetic", "--workflow", "solver-judge", "--estimator",
                              "solver=grpo,jugde=reinforce", "--output", str(tmp_path / "r")])
    assert out.exit_code == 1
    assert "has no role 'jugde'; its roles are judge, solver" in out.output
    out = runner.invoke(app, ["train", "arithmetic", "--workflow", "solver-jugde", "--output", str(tmp_path / "r")])
    assert out.exit_code == 1 and "unknown workflow 'solver-jugde'" in out.output
    out = runner.invoke(app, ["train", "arithmetic", "--roles", "judge=full", "--output", str(tmp_path / "r")])
    assert out.exit_code == 1 and "judge='full' is not a policy; write judge=lora:NAME" in out.output


def test_roles_on_a_backend_that_cannot_are_refused_by_name(tmp_path: Path, upstream: FakeUpstream) -> None:
    cfg = yesno_config(tmp_path, workflow="solver-judge", roles="judge=lora:judge")
    with pytest.raises(ConfigError, match=r"cannot train with --roles judge=lora:judge \(supported: none"):
        train(cfg, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), progress=False)


def test_an_agents_role_without_recorded_calls_is_named(tmp_path: Path, upstream: FakeUpstream) -> None:
    """A user's agent whose `critic` role calls the model outside the gateway: its trajectory has no steps, and
    the run stops at step 1 saying which role, instead of silently never training it."""
    from rllm_core.context import agent_scope
    from rllm_core.types import Episode

    @rollout(name="two_roles")
    async def two_roles(task, config):  # type: ignore[no-untyped-def]
        async with make_client(config) as client:
            with agent_scope("solver"):
                reply = await chat(client, config, [{"role": "user", "content": str(task.instruction)}])
        return Episode(trajectories=[Trajectory(name="critic")], artifacts={"answer": reply.text})

    cfg = yesno_config(tmp_path, max_steps=1, eval_examples=0)
    with pytest.raises(ConfigError, match=r"role 'critic' produced no steps .* while solver did"):
        train(cfg, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), rollout=two_roles,
              progress=False)


def test_an_agents_unknown_role_is_named_after_the_first_step(tmp_path: Path, upstream: FakeUpstream) -> None:
    """A user's agent declares no roles: an --estimator role it never plays is refused once step 1 shows its roles."""
    from rllm_core.context import agent_scope

    @rollout(name="one_role")
    async def one_role(task, config):  # type: ignore[no-untyped-def]
        async with make_client(config) as client:
            with agent_scope("planner"):
                return (await chat(client, config, [{"role": "user", "content": str(task.instruction)}])).text

    cfg = yesno_config(tmp_path, algo="planner=grpo,critic=reinforce", max_steps=1,
                       eval_examples=0)
    with pytest.raises(ConfigError, match=r"--estimator: agent 'one_role' has no role 'critic'; its roles are planner"):
        train(cfg, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), rollout=one_role,
              progress=False)


def test_the_gateway_sends_each_roles_calls_with_its_policys_model_name(upstream: FakeUpstream) -> None:
    """Agents keep sending their own model name; the gateway rewrites it by the calling agent's role
    (`solver#1` plays `solver`, unnamed roles go to '*')."""
    routes = {"solver": "solver-lora", "judge": "judge-lora", "*": "shared"}
    gw = start_gateway([UpstreamConfig(url=upstream.base_url, role_models=routes)])
    try:
        for agent in ("solver#1", "judge", "critic", None):
            headers = {"Authorization": f"Bearer {gw.client_api_key}", **({"X-RLLM-Agent": agent} if agent else {})}
            r = httpx.post(f"{gw.session_base_url('s1')}/chat/completions", headers=headers, timeout=30,
                           json={"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
    finally:
        gw.stop()
    assert [b["model"] for b in upstream.requests] == ["solver-lora", "judge-lora", "shared", "shared"]
