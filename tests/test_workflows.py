"""Each workflow runs end to end against the fake upstream and yields its named role trajectories."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rllm_core.errors import ConfigError
from rllm_core.types import group_trajectories
from rllm_envs.benchmarks import get_benchmark
from rllm_envs.workflows import get_workflow, iterative_refinement, self_debate, solver_judge
from rllm_envs.workflows.solver_judge import parse_pick
from rllm_rollout.engine import run_episodes
from rllm_testing.fake_upstream import start_fake_upstream


def _role_responder(body: dict[str, Any]) -> str:
    """Solvers: the first says the right sum, the second a wrong one (told apart by call count); the judge
    picks Solution 1; critics and moderators answer with the right number too."""
    text = body["messages"][-1]["content"]
    if "Which solution is correct" in text:
        return "Solution 1"
    m = re.search(r"What is (\d+) \+ (\d+)", str(body["messages"]))
    right = int(m.group(1)) + int(m.group(2)) if m else 0
    _role_responder.calls += 1  # type: ignore[attr-defined]
    if "Final answers of the debate" in text or "Check the answer" in text or "reviewer commented" in text:
        return f"{right}"
    return f"{right}" if _role_responder.calls % 2 else f"{right + 1}"  # type: ignore[attr-defined]


@pytest.fixture
def arith() -> tuple[Any, list[Any]]:
    bench = get_benchmark("arithmetic")
    return bench, bench.load("test", max_examples=2)


async def test_solver_judge(arith: tuple[Any, list[Any]]) -> None:
    bench, tasks = arith
    _role_responder.calls = 0  # type: ignore[attr-defined]
    with start_fake_upstream(_role_responder) as up:
        eps = await run_episodes(solver_judge(n_solvers=2), tasks, base_url=up.base_url, benchmark=bench,
                                 progress=False, concurrency=1)
    for ep in eps:
        names = sorted(t.name for t in ep.trajectories)
        assert names == ["judge", "solver", "solver"]
        solvers = [t for t in ep.trajectories if t.name == "solver"]
        assert sorted(t.metadata["agent"] for t in solvers) == ["solver#0", "solver#1"]
        assert all(len(t.steps) == 1 and t.steps[0].trainable for t in ep.trajectories)
        assert sorted(t.reward for t in solvers) == [0.0, 1.0]  # each solver graded on its own answer
        judge = ep.trajectory("judge")
        assert ep.artifacts["pick"] == 0 and judge.reward == ep.reward
    groups = {g.role: g for g in group_trajectories(eps)}
    assert len(groups["solver"].trajectories) == 2 and set(groups) == {"solver", "judge"}


async def test_refinement(arith: tuple[Any, list[Any]]) -> None:
    bench, tasks = arith
    _role_responder.calls = 0  # type: ignore[attr-defined]
    with start_fake_upstream(_role_responder) as up:
        eps = await run_episodes(iterative_refinement(rounds=2), tasks, base_url=up.base_url, benchmark=bench,
                                 progress=False)
    for ep in eps:  # every turn is its own trajectory: solver turns 0, 1, 2 and critics of rounds 1, 2
        solvers = [t for t in ep.trajectories if t.name == "solver"]
        critics = [t for t in ep.trajectories if t.name == "critic"]
        assert [t.metadata["turn"] for t in solvers] == [0, 1, 2] and [t.metadata["round"] for t in critics] == [1, 2]
        assert all(len(t.steps) == 1 and t.steps[0].trainable for t in ep.trajectories)
        assert len(ep.artifacts["rounds"]) == 2
        assert ep.reward_reason == "correct" and all(t.reward is not None for t in ep.trajectories)
        assert solvers[-1].reward == 1.0 and all(t.reward == 1.0 for t in critics)  # each graded on its own answer
        assert len(solvers[-1].steps[0].messages or []) == 5  # the revision sees answer + critique history


async def test_self_debate(arith: tuple[Any, list[Any]]) -> None:
    bench, tasks = arith
    _role_responder.calls = 0  # type: ignore[attr-defined]
    with start_fake_upstream(_role_responder) as up:
        eps = await run_episodes(self_debate(n_agents=3, rounds=2), tasks, base_url=up.base_url,
                                 benchmark=bench, progress=False)
    for ep in eps:
        debaters = [t for t in ep.trajectories if t.name == "debater"]
        assert len(debaters) == 3 and all(len(t.steps) == 2 for t in debaters)
        assert all(t.reward is not None for t in debaters)
        assert len(ep.trajectory("moderator").steps) == 1
        assert len(ep.artifacts["transcript"]) == 2 and ep.reward_reason == "correct"


def test_get_workflow_and_parse_pick() -> None:
    assert get_workflow("solver_judge").name == "solver_judge"
    with pytest.raises(ConfigError, match="solver-judge"):
        get_workflow("judge-only")
    assert parse_pick("I pick Solution 2.", 3) == 1
    assert parse_pick("none", 3) is None


def test_parse_pick_ignores_numbers_in_the_reasoning() -> None:
    assert parse_pick("Solution 1 is right because 2 + 2 = 4.", 2) == 0
    assert parse_pick("Solution 3 is wrong; I choose solution #2", 3) == 1
    assert parse_pick("2", 3) == 1 and parse_pick("**2**", 3) == 1
    assert parse_pick("Both are off by 2.", 3) is None
    assert parse_pick("Solution 7", 3) is None


async def test_judge_without_a_pick_is_not_rewarded(arith: tuple[Any, list[Any]]) -> None:
    """The episode still answers (solver 1's answer), but the judge that named nothing gets no reward."""
    bench, tasks = arith
    right = tasks[0].ground_truth

    def responder(body: dict[str, Any]) -> str:
        return "They all look fine." if "Which solution" in body["messages"][-1]["content"] else right

    with start_fake_upstream(responder) as up:
        (ep,) = await run_episodes(solver_judge(n_solvers=2), tasks[:1], base_url=up.base_url, benchmark=bench,
                                   progress=False)
    assert ep.artifacts["pick"] is None and ep.reward_reason == "correct"
    judge = ep.trajectory("judge")
    assert judge.reward == 0.0 and judge.metadata["reward_reason"] == "no_answer_extracted"
    assert all(t.reward == 1.0 for t in ep.trajectories if t.name == "solver")


async def test_role_answer_cut_off_is_truncated(arith: tuple[Any, list[Any]]) -> None:
    """A role's own answer gets the same reasons as an episode: a wrong answer at the token limit is truncated."""
    bench, tasks = arith

    with start_fake_upstream(lambda body: "Let me think about this for a long while") as up:
        (ep,) = await run_episodes(solver_judge(n_solvers=2), tasks[:1], base_url=up.base_url, benchmark=bench,
                                   progress=False, sampling={"max_tokens": 4})
    solvers = [t for t in ep.trajectories if t.name == "solver"]
    assert [t.metadata["reward_reason"] for t in solvers] == ["truncated", "truncated"]
    assert ep.reward_reason == "truncated"


async def test_workflows_quote_message_list_tasks_as_text() -> None:
    from rllm_core.types import Task

    seen: list[str] = []

    def responder(body: dict[str, Any]) -> str:
        seen.append(str(body["messages"][-1]["content"]))
        return "Solution 1"

    task = Task(id="m:0", instruction=[{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "What is 2 + 2?"}])
    with start_fake_upstream(responder) as up:
        await run_episodes(solver_judge(n_solvers=1), [task], base_url=up.base_url, progress=False)
    judge_prompt = next(s for s in seen if "Candidate solutions" in s)
    assert "Problem:\nWhat is 2 + 2?" in judge_prompt and "'role'" not in judge_prompt


def test_get_workflow_options() -> None:
    debate = get_workflow("self-debate:n_agents=3,rounds=1")
    assert debate.name == "self_debate"
    assert get_workflow("solver-judge", n_solvers=3).name == "solver_judge"
    with pytest.raises(ConfigError, match=r"has no option judges; its options are \['n_solvers'\]"):
        get_workflow("solver-judge:judges=2")
    with pytest.raises(ConfigError, match="name=INTEGER"):
        get_workflow("refinement:rounds")
    with pytest.raises(ConfigError, match="at least 2 agents"):
        get_workflow("self-debate:n_agents=1")


def _refinement_responder(first: str, critic: str) -> Any:
    """The first answer says `first`, the critic ends with `critic`, a revision repeats the critic's number."""
    def respond(body: dict[str, Any]) -> str:
        text = str(body["messages"][-1]["content"])
        if "Check the answer" in text:
            return f"Let me check. The answer is {critic}."
        if "reviewer commented" in text:
            return re.findall(r"\d+", text)[-1]
        return first
    return respond


@pytest.mark.parametrize(("first_right", "critic_right"), [(True, False), (False, True), (True, True)])
async def test_refinement_credits_each_turn_and_the_critic_on_its_own(arith: tuple[Any, list[Any]],
                                                                      first_right: bool, critic_right: bool) -> None:
    """A right first answer keeps its reward when the critic talks the revision out of it; a critic that fixes a
    wrong answer is rewarded and the answer it fixed is not; the episode is graded on the final answer."""
    bench, tasks = arith
    right = str(tasks[0].ground_truth)
    wrong = str(int(right) + 1)
    responder = _refinement_responder(right if first_right else wrong, right if critic_right else wrong)
    with start_fake_upstream(responder) as up:
        (ep,) = await run_episodes(iterative_refinement(rounds=1), tasks[:1], base_url=up.base_url,
                                   benchmark=bench, progress=False)
    first, revision = (t for t in ep.trajectories if t.name == "solver")
    assert (first.metadata["turn"], revision.metadata["turn"]) == (0, 1)
    assert first.reward == float(first_right) and first.metadata["answer"] == (right if first_right else wrong)
    assert ep.trajectory("critic").reward == float(critic_right)
    assert revision.reward == float(critic_right) == ep.reward  # the revision followed the critic
    assert {g.role: len(g.trajectories) for g in group_trajectories([ep])} == {"solver": 2, "critic": 1}


async def test_refinement_without_rounds_is_one_solver_turn(arith: tuple[Any, list[Any]]) -> None:
    bench, tasks = arith
    with start_fake_upstream(lambda body: str(tasks[0].ground_truth)) as up:
        (ep,) = await run_episodes(iterative_refinement(rounds=0), tasks[:1], base_url=up.base_url,
                                   benchmark=bench, progress=False)
    assert [(t.name, t.metadata["turn"], t.reward) for t in ep.trajectories] == [("solver", 0, 1.0)]


async def test_seeded_refinement_gives_each_call_its_own_seed(arith: tuple[Any, list[Any]]) -> None:
    _, tasks = arith
    with start_fake_upstream(lambda body: "7") as up:
        runs = [await run_episodes(iterative_refinement(rounds=2), tasks[:1], base_url=up.base_url,
                                   progress=False, sampling={"seed": 3}) for _ in range(2)]
    seeds = [[s.params.get("seed") for s in ep.steps] for (ep,) in runs]
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == 5 and None not in seeds[0]
