"""`@rllm.rollout` end to end with the real `openai` SDK against the fake upstream: every kind of function,
every kind of return value, failures and timeouts; the Episode's steps carry the server's exact ids."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

import rllm
from rllm_core.types import Episode, Step, Task, Trajectory
from rllm_testing.fake_upstream import encode, token_logprob

TASK = Task(id="t1", instruction="hello there")


def ask(config: rllm.RolloutConfig, text: str) -> str:
    client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    resp = client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": text}])
    return resp.choices[0].message.content or ""


async def aask(config: rllm.RolloutConfig, text: str, stream: bool = False) -> str:
    client = openai.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key, max_retries=0)
    try:
        messages = [{"role": "user", "content": text}]
        if not stream:
            resp = await client.chat.completions.create(model=config.model, messages=messages)
            return resp.choices[0].message.content or ""
        out = await client.chat.completions.create(model=config.model, messages=messages, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in out if c.choices])
    finally:
        await client.close()


def assert_exact(step: Step, asked: str) -> None:
    reply = encode(f"ok: {asked}"[:28])
    messages = [{"role": "user", "content": asked}]
    assert step.token_source == "server" and step.trainable
    assert step.prompt_token_ids == encode(json.dumps(messages, sort_keys=True, separators=(",", ":")))
    assert step.completion_token_ids == reply and step.logprobs == [token_logprob(t) for t in reply]


def test_sync_function_two_turns(fake_upstream):
    @rllm.rollout
    def solver(task: Task, config: rllm.RolloutConfig) -> str:
        first = ask(config, str(task.instruction))
        return ask(config, first)

    ep = solver.run(TASK, base_url=fake_upstream.base_url, model="m")
    assert ep.termination_reason == "completed" and ep.error is None
    assert ep.artifacts == {"answer": "ok: ok: hello there"} and ep.rollout == "solver"
    [traj] = ep.trajectories
    assert traj.name == "solver" and len(traj.steps) == 2
    assert_exact(traj.steps[0], "hello there")
    assert_exact(traj.steps[1], "ok: hello there")


async def test_async_function_streaming_and_agents(fake_upstream):
    @rllm.rollout(name="team")
    async def team(task: Task, config: rllm.RolloutConfig) -> dict[str, Any]:
        with rllm.agent_scope("writer"):
            draft = await aask(config, "draft", stream=True)
        with rllm.agent_scope("critic"):
            verdict = await aask(config, draft)
        return {"draft": draft, "verdict": verdict}

    ep = await team.arun(TASK, base_url=fake_upstream.base_url, model="m")
    assert ep.artifacts == {"draft": "ok: draft", "verdict": "ok: ok: draft"}
    assert [t.name for t in ep.trajectories] == ["writer", "critic"]
    assert_exact(ep.trajectory("writer").steps[0], "draft")
    assert_exact(ep.trajectory("critic").steps[0], "ok: draft")


async def test_awaitable_returning_and_async_generator(fake_upstream):
    def returns_coroutine(task: Task, config: rllm.RolloutConfig) -> Any:
        return aask(config, "lazy")

    async def generator(task: Task, config: rllm.RolloutConfig) -> Any:
        for word in ("one", "two"):
            yield await aask(config, word)

    ep1 = await rllm.rollout(returns_coroutine).arun(TASK, base_url=fake_upstream.base_url)
    ep2 = await rllm.rollout(generator).arun(TASK, base_url=fake_upstream.base_url)
    assert ep1.artifacts == {"answer": "ok: lazy"} and len(ep1.steps) == 1
    assert_exact(ep1.steps[0], "lazy")
    assert ep2.artifacts == {"answer": "ok: two"} and [s.messages[0]["content"] for s in ep2.steps] == ["one", "two"]


def test_calls_straight_to_the_upstream_are_captured_in_process(fake_upstream):
    @rllm.rollout
    def direct(task: Task, config: rllm.RolloutConfig) -> None:
        client = openai.OpenAI(base_url=config.upstream_url, api_key="x", max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "direct"}])

    ep = direct.run(TASK, base_url=fake_upstream.base_url)
    assert ep.artifacts == {} and len(ep.steps) == 1
    assert_exact(ep.steps[0], "direct")


@pytest.mark.parametrize("kind", ["episode", "trajectory", "trajectory_with_steps", "other"])
def test_return_values_are_coerced(fake_upstream, kind):
    def fn(task: Task, config: rllm.RolloutConfig) -> Any:
        ask(config, "x")
        if kind == "episode":
            return Episode(task=task, trajectories=[Trajectory(name="mine")], artifacts={"k": 1}, reward=0.5)
        if kind == "trajectory":
            return Trajectory(name="mine", reward=1.0)
        if kind == "trajectory_with_steps":
            return Trajectory(name="mine", steps=[Step(text="hand-made")])
        return 42

    ep = rllm.rollout(fn).run(TASK, base_url=fake_upstream.base_url)
    assert ep.termination_reason == "completed"
    if kind == "episode":
        assert ep.reward == 0.5 and ep.artifacts == {"k": 1} and [t.name for t in ep.trajectories] == ["mine", "fn"]
    elif kind == "trajectory":
        assert [t.name for t in ep.trajectories] == ["mine"] and ep.trajectories[0].reward == 1.0
        assert_exact(ep.trajectories[0].steps[0], "x")
    elif kind == "trajectory_with_steps":
        assert [s.text for s in ep.steps] == ["hand-made"]  # the user's own steps win
    else:
        assert ep.artifacts == {"result": "42"} and len(ep.steps) == 1


def test_exception_keeps_steps_and_traceback(fake_upstream):
    @rllm.rollout
    def crashes(task: Task, config: rllm.RolloutConfig) -> None:
        ask(config, "before")
        raise ValueError("tool exploded")

    with pytest.warns(rllm.RolloutFailedWarning, match=r"crashes ended with error: ValueError: tool explo"):
        ep = crashes.run(TASK, base_url=fake_upstream.base_url)  # by hand, a failure must not pass silently
    assert ep.termination_reason == "error"
    assert "Traceback" in (ep.error or "") and "ValueError: tool exploded" in (ep.error or "")
    assert len(ep.steps) == 1
    assert_exact(ep.steps[0], "before")


async def test_timeout_keeps_steps(fake_upstream):
    @rllm.rollout
    async def slow(task: Task, config: rllm.RolloutConfig) -> None:
        await aask(config, "quick")
        await asyncio.sleep(30)

    ep = await slow.arun(TASK, base_url=fake_upstream.base_url, timeout_s=0.5)
    assert ep.termination_reason == "timeout" and "timed out" in (ep.error or "")
    assert len(ep.steps) == 1


async def test_concurrent_episodes_do_not_mix(fake_upstream):
    @rllm.rollout
    async def agent(task: Task, config: rllm.RolloutConfig) -> str:
        return await aask(config, str(task.instruction), stream=True)

    tasks = [Task(id=f"t{i}", instruction=f"q{i}") for i in range(20)]
    eps = await asyncio.gather(*(agent.arun(t, base_url=fake_upstream.base_url) for t in tasks))
    for t, ep in zip(tasks, eps, strict=True):
        [step] = ep.steps
        assert step.messages == [{"role": "user", "content": t.instruction}]
        assert_exact(step, str(t.instruction))


async def test_blocking_agents_run_all_at_once_not_capped_by_the_default_pool(fake_upstream):
    """40 sync agents must all be inside their function at the same time (the loop's default pool has at most
    32 threads, 6 on a 2-core machine): the barrier breaks, and the episodes error, if they run a few at a time."""
    import threading

    n = 40
    barrier = threading.Barrier(n, timeout=20)

    @rllm.rollout
    def blocking(task: Task, config: rllm.RolloutConfig) -> str:
        barrier.wait()
        return ask(config, str(task.instruction))

    tasks = [Task(id=f"b{i}", instruction=f"b{i}") for i in range(n)]
    eps = await asyncio.gather(*(blocking.arun(t, base_url=fake_upstream.base_url) for t in tasks))
    assert [ep.error for ep in eps] == [None] * n
    for t, ep in zip(tasks, eps, strict=True):
        assert_exact(ep.steps[0], str(t.instruction))


def test_a_gateway_in_another_process_through_remote_gateway(fake_upstream):
    """What a Ray worker does: record through a gateway it did not start, with that gateway's bearer token."""
    import pickle

    from rllm_rollout.gateway import GatewayClient, RemoteGateway, UpstreamConfig, start_gateway

    @rllm.rollout
    def agent(task: Task, config: rllm.RolloutConfig) -> str:
        assert config.api_key == "gw-secret"  # the agent is handed the key of the gateway it talks to
        return ask(config, "remote")

    with start_gateway([UpstreamConfig(url=fake_upstream.base_url)], api_key="gw-secret") as gw:
        remote = pickle.loads(pickle.dumps(gw.remote()))  # as a Ray worker would receive it
        assert isinstance(remote, RemoteGateway) and remote.url == gw.url
        assert isinstance(remote, GatewayClient) and isinstance(gw, GatewayClient)
        try:
            ep = agent.run(TASK, gateway=remote, model="m")
            assert gw.store.sessions() == []  # taken means freed, on the gateway's side too
        finally:
            remote.close()
        with pytest.raises(rllm.RLLMError, match="refused the token"):
            RemoteGateway(gw.url, api_key="wrong").take_steps("x")
    assert ep.error is None and ep.artifacts == {"answer": "ok: remote"}
    assert_exact(ep.steps[0], "remote")
    with pytest.raises(rllm.RLLMError, match="unreachable"):
        RemoteGateway(gw.url, timeout_s=2, retry_s=0.5).take_steps("x")  # retries a restart, then gives up


def test_tokenizer_object_retokenizes_calls_through_the_gateway(fake_upstream, tiny_tokenizer):
    """A hosted-style upstream (no ids) and a tokenizer object: the gateway cannot load an object by path, so
    the rollout rebuilds the ids of the steps it collects, and marks them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)

    @rllm.rollout
    def agent(task: Task, config: rllm.RolloutConfig) -> str:
        return ask(config, "hello there")

    ep = agent.run(TASK, base_url=fake_upstream.base_url, inject_token_ids=False, tokenizer=tok)
    [step] = ep.steps
    assert "return_token_ids" not in fake_upstream.requests[-1]
    assert step.token_source == "retokenized" and step.text == "ok: hello there"
    assert step.prompt_token_ids == [2, 5, 6, 3] and step.completion_token_ids == [4, 5, 6, 1]


def test_bad_endpoint_is_a_clear_config_error():
    @rllm.rollout
    def agent(task: Task, config: rllm.RolloutConfig) -> None:
        return None

    with pytest.raises(rllm.RLLMError, match=r"base_url='localhost:8000'.*must look like http://HOST:PORT/v1"):
        agent.run(TASK, base_url="localhost:8000")
    with pytest.raises(rllm.RLLMError, match="needs base_url="):
        agent.run(TASK)


def test_sync_function_timeout_returns_promptly(fake_upstream):
    """A blocking agent past its timeout cannot be killed, but `run` returns at the timeout, not when it ends."""
    import time

    @rllm.rollout
    def stuck(task: Task, config: rllm.RolloutConfig) -> None:
        ask(config, "first")
        time.sleep(8)

    t0 = time.perf_counter()
    # 2 s: room for the first call on a loaded CI machine (at 0.5 s it was once still being made at the timeout)
    with pytest.warns(rllm.RolloutFailedWarning, match=r"stuck ended with timeout: rollout stuck timed out"):
        ep = stuck.run(TASK, base_url=fake_upstream.base_url, timeout_s=2.0)
    assert time.perf_counter() - t0 < 6.0
    assert ep.termination_reason == "timeout" and len(ep.steps) == 1
    assert_exact(ep.steps[0], "first")


@rllm.rollout
def module_level_agent(task: Task, config: rllm.RolloutConfig) -> str:
    return ask(config, str(task.instruction))


def test_rollouts_pickle_for_worker_processes(fake_upstream):
    import pickle

    again = pickle.loads(pickle.dumps(module_level_agent))
    assert again is module_level_agent  # by reference: the decorated module attribute
    by_value = pickle.loads(pickle.dumps(rllm.rollout(ask, name="asker")))
    assert isinstance(by_value, rllm.Rollout) and by_value.name == "asker" and by_value.fn is ask
    ep = again.run(TASK, base_url=fake_upstream.base_url)
    assert_exact(ep.steps[0], "hello there")


@pytest.mark.parametrize("timeout_s", [None, 30.0])
def test_the_agents_own_timeout_error_is_its_error_not_ours(fake_upstream, timeout_s):
    """An HTTP client's TimeoutError raised by the agent is recorded like any exception of the agent's, with
    its type and message; it was once reported as our timeout ("timed out after None s")."""

    @rllm.rollout
    async def impatient(task: Task, config: rllm.RolloutConfig) -> None:
        await aask(config, "before")
        raise TimeoutError("the tool server did not answer in 2 s")

    with pytest.warns(rllm.RolloutFailedWarning, match="impatient ended with error: TimeoutError: the tool server"):
        ep = impatient.run(TASK, base_url=fake_upstream.base_url, timeout_s=timeout_s)
    assert ep.termination_reason == "error" and "timed out after" not in (ep.error or "")
    assert "Traceback" in (ep.error or "") and "TimeoutError: the tool server did not answer in 2 s" in (ep.error or "")
    assert len(ep.steps) == 1


@pytest.mark.parametrize(("given", "suggested"), [("timeout", "timeout_s"), ("base_uri", "base_url"),
                                                  ("attempts", "attempt"), ("tokeniser", "tokenizer")])
def test_misspelt_keyword_arguments_are_refused(fake_upstream, given, suggested):
    ran: list[bool] = []

    @rllm.rollout
    def agent(task: Task, config: rllm.RolloutConfig) -> None:
        ran.append(True)

    kwargs = {"base_url": fake_upstream.base_url, given: 5}
    if given == "base_uri":
        kwargs.pop("base_url")
    expected = rf"unknown keyword argument {given}= \(did you mean {suggested}=\?\)"
    with pytest.raises(rllm.RLLMError, match=expected) as info:
        agent.run(TASK, **kwargs)
    assert "timeout_s, attempt, sampling" in str(info.value)  # the valid ones are named
    with pytest.raises(rllm.RLLMError, match=r"upstream_url= is set by the rollout itself"):
        agent.run(TASK, base_url=fake_upstream.base_url, upstream_url="http://elsewhere/v1")
    assert ran == []  # refused before the agent ran


def test_the_arun_keyword_list_matches_its_signature():
    import inspect

    from rllm_rollout.rollout import _ARUN_KEYWORDS

    params = inspect.signature(rllm.Rollout.arun).parameters.values()
    assert tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY) == _ARUN_KEYWORDS


def test_other_extra_keywords_still_become_config_fields(fake_upstream):
    @rllm.rollout
    def agent(task: Task, config: rllm.RolloutConfig) -> str:
        return f"{config.mode} {config.max_turns} {config.judge_model}"  # type: ignore[attr-defined]

    ep = agent.run(TASK, base_url=fake_upstream.base_url, mode="cot", max_turns=3, judge_model="j")
    assert ep.artifacts == {"answer": "cot 3 j"}


async def test_retokenizing_runs_off_the_event_loop(fake_upstream, monkeypatch):
    """Retokenizing a big episode is CPU work: it runs in a worker thread while other episodes go on."""
    import importlib
    import threading
    import time

    retok = importlib.import_module("rllm_rollout.capture.retokenize")  # the package exports a same-named function
    loop_thread = threading.get_ident()
    threads: list[int] = []
    real = retok.retokenize_step

    def slow_retokenize(step: Step, tokenizer: Any) -> Step:
        threads.append(threading.get_ident())
        time.sleep(0.3)  # a big episode's worth of tokenizing
        return real(step, tokenizer)

    monkeypatch.setattr(retok, "retokenize_step", slow_retokenize)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    @rllm.rollout
    async def agent(task: Task, config: rllm.RolloutConfig) -> str:
        return await aask(config, "x")

    beat = asyncio.create_task(ticker())
    try:
        ep = await agent.arun(TASK, base_url=fake_upstream.base_url, tokenizer=object())
    finally:
        beat.cancel()
    assert len(ep.steps) == 1 and threads and loop_thread not in threads
    assert ticks >= 5  # the loop kept running while the step was retokenized
