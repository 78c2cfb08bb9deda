"""The Tinker sampling server: the local policy server's HTTP app answering with a Tinker `SamplingClient`.

Most tests go through the real `openai` SDK and the rllm gateway against the shared SDK double
(`rllm_backends.tinker.double`), and check that what the gateway records is exactly what the double sampled.
Behaviour the tiny model will not show by itself (tool calls, transient failures, slow calls) uses small
scripted clients with the SDK's `sample` signature and the SDK's own response types.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tinker
from tinker import types as ttypes

from rllm_backends.tinker.sampling import TinkerSamplingEngine, tinker_sampling_params
from rllm_backends.tinker.server import TinkerSamplingServer, start_tinker_sampling_server
from rllm_rollout.gateway import GatewayHandle, start_gateway
from rllm_serve.models import load_tokenizer
from rllm_serve.sampling import SamplingParams

MSGS = [{"role": "user", "content": "What is two plus two?"}]
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add one",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("tiny-random")


def client_for(gw: GatewayHandle, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.session_base_url(sid), api_key=gw.client_api_key, max_retries=0)


def _request() -> httpx.Request:
    return httpx.Request("POST", "http://tinker.invalid/api/v1/asample")


class ScriptedClient:
    """A SamplingClient stand-in: `sample` (the SDK's signature) answers `reply(prompt_ids, params)` tokens.

    Logs every call; `fail` is a list of exceptions raised by the first calls; `delay` keeps a call in flight.
    """

    def __init__(self, tokenizer: Any, reply: Callable[[list[int], Any], list[int]], *,
                 fail: list[BaseException] | None = None, delay: float = 0.0, stop_reason: str = "stop",
                 gate: asyncio.Event | None = None) -> None:
        self.tokenizer, self.reply, self.fail, self.delay = tokenizer, reply, list(fail or []), delay
        self.stop_reason, self.gate = stop_reason, gate
        self.calls: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self.cancelled = 0
        self._lock = threading.Lock()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def sample(self, prompt: ttypes.ModelInput, num_samples: int, sampling_params: ttypes.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
               topk_sample_logprobs: int = 0) -> Any:
        self.calls.append({"prompt": prompt.to_ints(), "n": num_samples, "params": sampling_params,
                           "topk": topk_sample_logprobs})
        return self._answer(prompt.to_ints(), num_samples, sampling_params, topk_sample_logprobs)

    async def _answer(self, ids: list[int], n: int, params: ttypes.SamplingParams, topk: int) -> Any:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.gate is not None:
                await self.gate.wait()
            if self.fail:
                raise self.fail.pop(0)
            seqs = []
            for i in range(n):
                toks = self.reply(ids, params)
                lps = [-0.25 - 0.01 * (k + i) for k in range(len(toks))]
                top = [[(t, lp), (t + 1, lp - 1.0)] for t, lp in zip(toks, lps, strict=True)][:topk and None]
                seqs.append(ttypes.SampledSequence(
                    stop_reason=self.stop_reason, sequence_id=f"s{i}", tokens_np=np.array(toks, dtype=np.int32),
                    logprobs_np=np.array(lps, dtype=np.float32), _topk_logprobs_list=top if topk else None))
            return ttypes.SampleResponse(sequences=seqs)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            with self._lock:
                self.in_flight -= 1


def text_reply(tokenizer: Any, text: str, eos: bool = True) -> Callable[[list[int], Any], list[int]]:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return lambda _prompt, _params: ids + ([tokenizer.eos_token_id] if eos else [])


@pytest.fixture
def serve(tokenizer: Any) -> Iterator[Callable[..., TinkerSamplingServer]]:
    started: list[TinkerSamplingServer] = []

    def start(client: Any, **kw: Any) -> TinkerSamplingServer:
        kw.setdefault("retry_wait_s", 0.01)
        srv = start_tinker_sampling_server(client, model_name="tiny-random", context_length=2048, **kw)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


# ------------------------------------------------------------------------------------------- units
def test_sampling_params_reach_tinker_with_eos_and_stop_strings_as_tinker_takes_them(tokenizer: Any) -> None:
    eos = {tokenizer.eos_token_id}
    p = tinker_sampling_params(SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=5, seed=3,
                                              stop_token_ids=(42,)), eos, tokenizer)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed) == (7, 0.5, 0.9, 5, 3)
    assert p.stop == sorted({tokenizer.eos_token_id, 42})
    assert tinker_sampling_params(SamplingParams(max_tokens=1, ignore_eos=True), eos, tokenizer).stop == []
    plain = tinker_sampling_params(SamplingParams(max_tokens=1), eos, tokenizer)
    assert plain.top_k == -1
    assert plain.stop is None  # the service's own EOS rule: it knows every EOS id of the model
    with_text = tinker_sampling_params(SamplingParams(max_tokens=1, stop=("END",)), eos, tokenizer)
    assert with_text.stop == ["END", tokenizer.eos_token]  # strings only: EOS goes as its text


def test_bad_settings_are_refused_by_name(tokenizer: Any) -> None:
    from rllm_core.errors import ConfigError

    client = ScriptedClient(tokenizer, text_reply(tokenizer, "x"))
    with pytest.raises(ConfigError, match="max_concurrency"):
        TinkerSamplingEngine(client, model_name="m", max_concurrency=0)
    with pytest.raises(ConfigError, match="retry_attempts"):
        TinkerSamplingEngine(client, model_name="m", retry_attempts=0)
    engine = TinkerSamplingEngine(client, model_name="m")
    assert engine.loaded.tokenizer is tokenizer and engine.loaded.context_length == 32768
    assert engine.loaded.eos_token_ids == {tokenizer.eos_token_id} and engine.loaded.name == "m"


# ------------------------------------------------------------------------------------------- scripted clients
def test_tool_calls_are_parsed_from_the_models_own_format(serve: Any, tokenizer: Any) -> None:
    tokenizer = load_tokenizer("tiny-random")  # own copy: the template is changed
    tokenizer.chat_template = TOOLS_TEMPLATE
    text = 'Sure.<tool_call>{"name": "add", "arguments": {"x": 1}}</tool_call>'
    client = ScriptedClient(tokenizer, text_reply(tokenizer, text))
    srv = serve(client, tokenizer=tokenizer)
    with start_gateway([srv.upstream_config()]) as gw:
        oa = client_for(gw, "tools")
        resp = oa.chat.completions.create(model="tiny-random", messages=MSGS, tools=TOOLS, max_tokens=64)
        [step] = gw.take_steps("tools")
    msg = resp.choices[0].message
    assert msg.content == "Sure." and resp.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls and msg.tool_calls[0].function.name == "add"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"x": 1}
    assert step.tool_calls and step.tool_calls[0]["function"]["name"] == "add"
    expected = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    assert step.completion_token_ids == expected and step.token_source == "server"
    assert step.logprobs == pytest.approx([-0.25 - 0.01 * k for k in range(len(expected))])
    prompt = tokenizer.decode(client.calls[0]["prompt"])
    assert prompt.startswith("<|im_start|>system\nTools: ") and '"add"' in prompt


def test_swap_serves_the_new_client_and_running_requests_keep_their_version(serve: Any, tokenizer: Any) -> None:
    old = ScriptedClient(tokenizer, text_reply(tokenizer, "old"), delay=0.5)
    new = ScriptedClient(tokenizer, text_reply(tokenizer, "new"))
    srv = serve(old)
    body = {"model": "tiny-random", "messages": MSGS, "max_tokens": 8}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, srv.base_url + "/chat/completions", json=body, timeout=30)
        deadline = time.monotonic() + 10
        while not old.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.swap(new, 1) == 1 and srv.policy_version == 1 and srv.sampling_client is new
        after = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=30).json()
        before = running.result().json()
    assert (before["policy_version"], before["choices"][0]["message"]["content"]) == (0, "old")
    assert (after["policy_version"], after["choices"][0]["message"]["content"]) == (1, "new")
    assert httpx.get(srv.url + "/health").json()["policy_version"] == 1
    assert srv.swap(new) == 2  # default: the next version
    with pytest.raises(TypeError, match="swap"):
        srv.update_weights({})


def test_transient_errors_are_retried_then_succeed(serve: Any, tokenizer: Any) -> None:
    flaky = [tinker.APIConnectionError(request=_request()), tinker.InternalServerError(
        "busy", response=httpx.Response(503, request=_request()), body=None)]
    client = ScriptedClient(tokenizer, text_reply(tokenizer, "fine"), fail=flaky)
    srv = serve(client, retry_attempts=3)
    r = httpx.post(srv.base_url + "/chat/completions", json={"messages": MSGS, "max_tokens": 8}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "fine" and len(client.calls) == 3


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_after_the_last_retry_the_client_gets_an_error_not_a_hang(serve: Any, tokenizer: Any, stream: bool) -> None:
    fails = [tinker.APIConnectionError(request=_request(), message="service unreachable") for _ in range(5)]
    client = ScriptedClient(tokenizer, text_reply(tokenizer, "never"), fail=fails)
    srv = serve(client, retry_attempts=3)
    oa = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=30)
    started = time.monotonic()
    if stream:
        chunks = oa.chat.completions.create(model="tiny-random", messages=MSGS, max_tokens=4, stream=True)
        with pytest.raises(openai.APIError, match="service unreachable"):
            list(chunks)
    else:
        with pytest.raises(openai.InternalServerError, match="service unreachable"):
            oa.chat.completions.create(model="tiny-random", messages=MSGS, max_tokens=4)
    assert len(client.calls) == 3 and time.monotonic() - started < 10


def test_a_non_transient_error_is_not_retried(serve: Any, tokenizer: Any) -> None:
    bad = tinker.BadRequestError("prompt too long for this sampler", response=httpx.Response(
        400, request=_request()), body=None)
    client = ScriptedClient(tokenizer, text_reply(tokenizer, "never"), fail=[bad])
    srv = serve(client, retry_attempts=4)
    r = httpx.post(srv.base_url + "/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert r.status_code == 500 and "prompt too long for this sampler" in r.json()["error"]["message"]
    assert len(client.calls) == 1


def test_concurrency_is_limited(serve: Any, tokenizer: Any) -> None:
    client = ScriptedClient(tokenizer, text_reply(tokenizer, "ok"), delay=0.2)
    srv = serve(client, max_concurrency=2)
    body = {"messages": MSGS, "max_tokens": 4}
    with ThreadPoolExecutor(6) as pool:
        rs = list(pool.map(lambda _: httpx.post(srv.base_url + "/chat/completions", json=body, timeout=30),
                           range(6)))
    assert all(r.status_code == 200 for r in rs)
    assert len(client.calls) == 6 and client.max_in_flight == 2


def test_stop_strings_cut_the_text_and_tinkers_last_token_ends_the_choice(serve: Any, tokenizer: Any) -> None:
    client = ScriptedClient(tokenizer, text_reply(tokenizer, "one two END three", eos=False))
    srv = serve(client)
    r = httpx.post(srv.base_url + "/chat/completions", timeout=30, json={
        "messages": MSGS, "max_tokens": 50, "stop": ["END"], "return_token_ids": True}).json()
    assert r["choices"][0]["message"]["content"] == "one two " and r["choices"][0]["finish_reason"] == "stop"
    assert client.calls[0]["params"].stop == ["END", tokenizer.eos_token]
    ids = r["choices"][0]["token_ids"]
    assert tokenizer.decode(ids).startswith("one two END") and "three" not in tokenizer.decode(ids)
    # Tinker stopped (its own stop rule) short of anything ours sees: the choice still ends, all text flushed
    short = ScriptedClient(tokenizer, text_reply(tokenizer, "abc de", eos=False))
    srv2 = serve(short)
    r2 = httpx.post(srv2.base_url + "/chat/completions", timeout=30, json={
        "messages": MSGS, "max_tokens": 50, "stop": ["zzz"]}).json()
    assert r2["choices"][0]["message"]["content"] == "abc de" and r2["choices"][0]["finish_reason"] == "stop"
    length = ScriptedClient(tokenizer, text_reply(tokenizer, "abc de", eos=False), stop_reason="length")
    r3 = httpx.post(serve(length).base_url + "/completions", timeout=30, json={"prompt": "x", "max_tokens": 50}).json()
    assert r3["choices"][0]["text"] == "abc de" and r3["choices"][0]["finish_reason"] == "length"


def test_top_logprobs_are_tinkers_per_token_alternatives(serve: Any, tokenizer: Any) -> None:
    client = ScriptedClient(tokenizer, text_reply(tokenizer, "hi there"))
    srv = serve(client)
    r = httpx.post(srv.base_url + "/chat/completions", timeout=30, json={
        "messages": MSGS, "max_tokens": 8, "logprobs": True, "top_logprobs": 2}).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert client.calls[0]["topk"] == 2 and len(content) == 3
    assert [len(c["top_logprobs"]) for c in content] == [2, 2, 2]
    assert content[0]["top_logprobs"][1]["logprob"] == pytest.approx(content[0]["logprob"] - 1.0)


def test_a_client_that_goes_away_cancels_its_call_and_stop_ends_the_rest(serve: Any, tokenizer: Any) -> None:
    gate = asyncio.Event()  # never set: the call hangs until cancelled
    client = ScriptedClient(tokenizer, text_reply(tokenizer, "x"), gate=gate)
    srv = serve(client)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.base_url + "/chat/completions", json={"messages": MSGS, "max_tokens": 4}, timeout=0.5)
    deadline = time.monotonic() + 10
    while client.cancelled < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.cancelled == 1 and srv.tinker_engine.running == 0
    with ThreadPoolExecutor(1) as pool:
        hung = pool.submit(httpx.post, srv.base_url + "/chat/completions",
                           json={"messages": MSGS, "max_tokens": 4}, timeout=30)
        while srv.tinker_engine.running < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        srv.stop()
        r = hung.result()
    assert r.status_code == 500 and "stopped" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------------------- the shared SDK double
@pytest.fixture(scope="module")
def double(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from rllm_backends.tinker.double import ServiceDouble

    return ServiceDouble(tmp_path_factory.mktemp("tinker-double"))


@pytest.fixture(scope="module")
def double_server(double: Any) -> Iterator[TinkerSamplingServer]:
    client = double.create_sampling_client(base_model="tiny-random").result()
    caps = double.get_server_capabilities  # the context length the service reports for the model
    with pytest.warns(FutureWarning):
        ctx = caps().supported_models[0].max_context_length
    with start_tinker_sampling_server(client, model_name="tiny-random", context_length=ctx) as srv:
        yield srv


def sampled(double: Any, since: int) -> list[Any]:
    """The double's answers to `sample` calls after log position `since`."""
    return [e for e in double.log[since:] if e.method == "sample"]


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_through_the_gateway_records_exactly_what_tinker_sampled(double: Any, double_server: Any,
                                                                     stream: bool) -> None:
    since = len(double.log)
    with start_gateway([double_server.upstream_config()]) as gw:
        oa = client_for(gw, "chat")
        kw: dict[str, Any] = {"model": "tiny-random", "messages": MSGS, "max_tokens": 6, "temperature": 1.0}
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in oa.chat.completions.create(**kw, stream=True)
                           if c.choices)
        else:
            resp = oa.chat.completions.create(**kw)
            text = resp.choices[0].message.content or ""
            assert resp.model_extra["policy_version"] == 0
        [step] = gw.take_steps("chat")
    [entry] = sampled(double, since)
    [seq] = entry.response.sequences
    tok = double_server.loaded.tokenizer
    assert step.token_source == "server" and step.trainable and step.policy_version == 0
    assert step.prompt_token_ids == chat_prompt_ids(tok, MSGS) == entry.request["prompt"]
    assert step.completion_token_ids == seq.tokens and step.logprobs == seq.logprobs
    assert step.text == text and step.finish_reason == ("length" if len(seq.tokens) == 6 else "stop")


def test_completions_and_a_seeded_request_through_the_gateway(double: Any, double_server: Any) -> None:
    since = len(double.log)
    with start_gateway([double_server.upstream_config()]) as gw:
        oa = client_for(gw, "comp")
        a = oa.completions.create(model="tiny-random", prompt="Once upon a time", max_tokens=5, seed=11,
                                  temperature=1.0)
        b = oa.completions.create(model="tiny-random", prompt="Once upon a time", max_tokens=5, seed=11,
                                  temperature=1.0)
        steps = gw.take_steps("comp")
    entries = sampled(double, since)
    assert len(entries) == len(steps) == 2 and a.choices[0].text == b.choices[0].text
    tok = double_server.loaded.tokenizer
    for step, entry in zip(steps, entries, strict=True):
        [seq] = entry.response.sequences
        assert step.endpoint == "completions" and step.token_source == "server"
        assert step.prompt_token_ids == list(tok("Once upon a time")["input_ids"]) == entry.request["prompt"]
        assert step.completion_token_ids == seq.tokens and step.logprobs == seq.logprobs
    assert steps[0].completion_token_ids == steps[1].completion_token_ids  # the seed reached Tinker
    assert entries[0].request["sampling_params"].seed == 11


def test_responses_api_and_a_transient_fault_of_the_double(double: Any, double_server: Any) -> None:
    double.faults.add("sample", 2, "server")
    since = len(double.log)
    with start_gateway([double_server.upstream_config()]) as gw:
        r = client_for(gw, "resp").responses.create(model="tiny-random", input="hi", max_output_tokens=4)
        [step] = gw.take_steps("resp")
    entries = sampled(double, since)
    assert [e.error is not None for e in entries] == [True, True, False]
    [seq] = entries[-1].response.sequences
    assert step.endpoint == "responses" and step.token_source == "server"
    assert step.completion_token_ids == seq.tokens and step.logprobs == seq.logprobs
    assert step.text == r.output_text


def test_swap_between_double_clients_and_a_fault_that_outlasts_the_retries(double: Any) -> None:
    first = double.create_sampling_client(base_model="tiny-random").result()
    second = double.create_sampling_client(base_model="tiny-random").result()
    kw: dict[str, Any] = {"model": "tiny-random", "messages": MSGS, "max_tokens": 3}
    with start_tinker_sampling_server(first, model_name="tiny-random", context_length=2048, retry_attempts=2,
                                      retry_wait_s=0.01) as srv, start_gateway([srv.upstream_config()]) as gw:
        oa = client_for(gw, "swap")
        assert oa.chat.completions.create(**kw).model_extra["policy_version"] == 0
        assert srv.swap(second, 1) == 1
        assert oa.chat.completions.create(**kw).model_extra["policy_version"] == 1
        old, new = gw.take_steps("swap")
        double.faults.add("sample", 2, "rate_limit")
        with pytest.raises(openai.InternalServerError, match="rate limited"):
            client_for(gw, "swap-fault").chat.completions.create(**kw)
    assert len(first.log) == 1 and len(second.log) == 3 and not double.faults.pending["sample"]
    assert (old.policy_version, new.policy_version) == (0, 1)
    assert new.completion_token_ids == second.log[0].response.sequences[0].tokens
    assert old.completion_token_ids == first.log[0].response.sequences[0].tokens
