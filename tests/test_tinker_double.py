"""The Tinker double (rllm_backends/tinker/double.py) is faithful to the SDK it stands in for.

Signatures are compared with the installed SDK's classes; numbers are compared with a direct forward pass of the
same tiny model, and with Tinker's documented loss formulas.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from pathlib import Path

import pytest
import tinker
import torch
from tinker import types
from tinker.lib.retry_handler import RetryHandler

from rllm_backends.tinker.double import (
    SamplingClientDouble,
    ServiceDouble,
    TrainingClientDouble,
    service_double_from_env,
)

METHODS = {
    (ServiceDouble, tinker.ServiceClient): [
        "get_server_capabilities", "create_lora_training_client", "create_training_client_from_state",
        "create_training_client_from_state_with_optimizer", "create_sampling_client"],
    (TrainingClientDouble, tinker.TrainingClient): [
        "forward", "forward_backward", "forward_backward_custom", "optim_step", "save_state", "load_state",
        "load_state_with_optimizer", "save_weights_for_sampler", "save_weights_and_get_sampling_client",
        "create_sampling_client", "get_info"],
    (SamplingClientDouble, tinker.SamplingClient): ["sample", "compute_logprobs", "get_base_model"],
}


def _shape(fn: object) -> tuple[list[tuple[str, object, object]], bool]:
    params = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]
    return params, inspect.iscoroutinefunction(inspect.unwrap(fn))  # type: ignore[arg-type]


@pytest.mark.parametrize("pair", list(METHODS), ids=lambda p: p[0].__name__)
def test_signatures_match_the_sdk(pair: tuple[type, type]) -> None:
    double, real = pair
    names = [n for base in METHODS[pair] for n in (base, base + "_async")] + ["get_tokenizer"] * (real is not
                                                                                                 tinker.ServiceClient)
    for name in names:
        assert _shape(getattr(double, name)) == _shape(getattr(real, name)), f"{double.__name__}.{name}"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> ServiceDouble:
    return ServiceDouble(tmp_path_factory.mktemp("double"), base_models=("tiny-random", "Qwen/Qwen3-8B"))


@pytest.fixture(scope="module")
def tok(svc: ServiceDouble) -> object:
    return svc.create_sampling_client(base_model="tiny-random").result().get_tokenizer()


def _datum(tokens: list[int], **inputs: torch.Tensor) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": torch.tensor(tokens[1:]), **inputs})


def test_sampling_is_seeded_and_its_logprobs_match_a_forward_pass(svc: ServiceDouble, tok: object) -> None:
    sc = svc.create_sampling_client(base_model="Qwen/Qwen3-8B").result()
    prompt = types.ModelInput.from_ints(tok.encode("The weather today is"))  # type: ignore[attr-defined]
    params = types.SamplingParams(max_tokens=6, seed=7, temperature=0.7, stop=[])
    a, b = sc.sample(prompt, 2, params).result(), sc.sample(prompt, 2, params).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert a.sequences[0].tokens != a.sequences[1].tokens  # two draws, not one repeated
    assert [s.stop_reason for s in a.sequences] == ["length", "length"]
    assert sc.log[-1].response is b and svc.log[-1] is sc.log[-1]

    seq = a.sequences[0]
    full = prompt.to_ints() + seq.tokens
    model = sc._policy_ref().model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([full])).logits[0, len(prompt.to_ints()) - 1:-1].float()
    expect = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(seq.tokens)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(seq.logprobs), expect, atol=1e-5)

    t1 = sc.sample(prompt, 1, types.SamplingParams(max_tokens=6, seed=1, stop=[])).result().sequences[0]
    scored = sc.compute_logprobs(types.ModelInput.from_ints(prompt.to_ints() + t1.tokens)).result()
    assert scored[0] is None and len(scored) == len(prompt.to_ints()) + len(t1.tokens)
    assert torch.allclose(torch.tensor(scored[-len(t1.tokens):]), torch.tensor(t1.logprobs), atol=1e-5)


def test_stop_tokens_and_strings_end_a_sample(svc: ServiceDouble, tok: object) -> None:
    sc = svc.create_sampling_client(base_model="tiny-random").result()
    prompt = types.ModelInput.from_ints(tok.encode("Hi"))  # type: ignore[attr-defined]
    free = sc.sample(prompt, 1, types.SamplingParams(max_tokens=5, seed=3, stop=[])).result().sequences[0]
    by_id = sc.sample(prompt, 1, types.SamplingParams(max_tokens=5, seed=3, stop=[free.tokens[1]])).result()
    assert by_id.sequences[0].tokens == free.tokens[:2] and by_id.sequences[0].stop_reason == "stop"
    text = tok.decode(free.tokens[:3])  # type: ignore[attr-defined]
    by_str = sc.sample(prompt, 1, types.SamplingParams(max_tokens=5, seed=3, stop=text[-1])).result().sequences[0]
    assert by_str.stop_reason == "stop" and len(by_str.tokens) <= 3


def test_builtin_losses_follow_the_documented_formulas(svc: ServiceDouble) -> None:
    tc = svc.create_lora_training_client("tiny-random", rank=8).result()
    torch.manual_seed(0)
    tokens = torch.randint(0, 1000, (9,)).tolist()
    q, adv = -torch.rand(8) * 5, torch.randn(8)
    out = tc.forward([_datum(tokens, weights=torch.ones(8))], "cross_entropy").result()
    lp = out.loss_fn_outputs[0]["logprobs"].to_torch()
    assert out.metrics["loss:sum"] == pytest.approx(float(-lp.sum()), rel=1e-5)
    datum = _datum(tokens, logprobs=q, advantages=adv)
    got = tc.forward_backward([datum], "importance_sampling").result()
    assert got.metrics["loss:sum"] == pytest.approx(float(-(torch.exp(lp - q) * adv).sum()), rel=1e-5)
    ratio = torch.exp(lp - q)
    ppo = -torch.min(ratio * adv, ratio.clamp(0.5, 1.5) * adv).sum()
    got = tc.forward([datum], "ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}).result()
    assert got.metrics["loss:sum"] == pytest.approx(float(ppo), rel=1e-5)
    with pytest.raises(tinker.BadRequestError, match="cross_entropy"):
        tc.forward([datum], "dro").result()


def test_gradients_accumulate_until_optim_step(svc: ServiceDouble) -> None:
    a = svc.create_lora_training_client("tiny-random", rank=8).result()
    b = svc.create_lora_training_client("tiny-random", rank=8).result()
    d1, d2 = _datum([5, 6, 7, 8, 9]), _datum([10, 11, 12, 13])
    a.forward_backward([d1], "cross_entropy").result()
    a.forward_backward([d2], "cross_entropy").result()
    b.forward_backward([d1, d2], "cross_entropy").result()
    pa, pb = next(a.policy.model.parameters()), next(b.policy.model.parameters())
    assert pa.grad is not None and torch.allclose(pa.grad, pb.grad, atol=1e-6)
    before = pa.detach().clone()
    a.optim_step(types.AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)).result()
    assert not torch.equal(before, pa.detach()) and not pa.grad.any()  # zeroed (not None), as a service would


def test_custom_loss_matches_the_builtin_it_spells_out(svc: ServiceDouble) -> None:
    a = svc.create_lora_training_client("tiny-random", rank=8).result()
    b = svc.create_lora_training_client("tiny-random", rank=8).result()
    data = [_datum([3, 4, 5, 6, 7], weights=torch.tensor([0.0, 1.0, 1.0, 0.5]))]

    def nll(batch: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(batch, logprobs, strict=True))
        return loss, {"custom:sum": 1.0}  # type: ignore[return-value]

    out = a.forward_backward_custom(data, nll).result()
    ref = b.forward_backward(data, "cross_entropy").result()
    assert out.metrics["loss:sum"] == pytest.approx(ref.metrics["loss:sum"], rel=1e-5)
    assert out.metrics["custom:sum"] == 1.0 and "surrogate_loss:sum" in out.metrics
    for pa, pb in zip(a.policy.model.parameters(), b.policy.model.parameters(), strict=True):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6)


def test_checkpoints_round_trip_through_a_new_service(svc: ServiceDouble, tok: object) -> None:
    tc = svc.create_lora_training_client("Qwen/Qwen3-8B", rank=16).result()
    snapshot = tc.save_weights_and_get_sampling_client().result()
    data = [_datum([20, 21, 22, 23, 24])]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    saved = tc.save_state("step1").result()
    assert saved.path == f"tinker://{tc.model_id}/weights/step1"
    sampler_path = tc.save_weights_for_sampler("s1").result().path
    prompt = types.ModelInput.from_ints([20, 21, 22, 23, 24])
    now = tc.save_weights_and_get_sampling_client().result().compute_logprobs(prompt).result()
    assert snapshot.compute_logprobs(prompt).result()[1:] != now[1:]  # the old snapshot kept the old weights

    fresh = ServiceDouble(svc.root, base_models=("Qwen/Qwen3-8B",))
    restored = fresh.create_training_client_from_state_with_optimizer(saved.path).result()
    assert restored.get_info().lora_rank == 16 and restored.get_info().model_data.model_name == "Qwen/Qwen3-8B"
    assert restored.optimizer.state_dict()["state"]  # Adam moments came back too
    back = restored.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_torch()
    again = tc.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_torch()
    assert torch.allclose(back, again, atol=1e-6)
    from_path = fresh.create_sampling_client(model_path=sampler_path).result()
    assert from_path.compute_logprobs(prompt).result() == pytest.approx(now, abs=1e-6)
    with pytest.raises(tinker.NotFoundError):
        fresh.create_sampling_client(model_path=f"tinker://{tc.model_id}/weights/nope").result()


def test_bad_model_and_rank_are_refused_with_what_is_supported(svc: ServiceDouble) -> None:
    with pytest.raises(tinker.BadRequestError, match="supported models: tiny-random, Qwen/Qwen3-8B"):
        svc.create_lora_training_client("meta-llama/Llama-3.1-8B").result()
    for rank in (12, 256):
        with pytest.raises(tinker.BadRequestError, match="power of two from 1 to 128"):
            svc.create_lora_training_client("tiny-random", rank=rank).result()
    with pytest.raises(ValueError, match="model_path or base_model"):
        svc.create_sampling_client()
    sc = svc.create_sampling_client(base_model="tiny-random").result()
    with pytest.raises(tinker.BadRequestError, match="prompt is empty"):
        sc.sample(types.ModelInput.empty(), 1, types.SamplingParams(max_tokens=1)).result()
    tc = svc.create_lora_training_client("tiny-random", rank=4).result()
    short = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3]})
    with pytest.raises(tinker.BadRequestError, match="must be equal"):
        tc.forward_backward([short], "cross_entropy").result()


def test_injected_faults_are_transient_errors_the_sdk_retries(tmp_path: Path) -> None:
    svc = ServiceDouble(tmp_path, faults={"sample": 2, "optim_step": (1, "server")})
    sc = svc.create_sampling_client(base_model="tiny-random").result()
    prompt, params = types.ModelInput.from_ints([1, 2, 3]), types.SamplingParams(max_tokens=2, seed=0)
    retry = RetryHandler()
    for _ in range(2):
        with pytest.raises(tinker.APIConnectionError) as info:
            sc.sample(prompt, 1, params).result()
        assert retry._should_retry(info.value)
    assert len(sc.sample(prompt, 1, params).result().sequences[0].tokens) == 2
    tc = svc.create_lora_training_client("tiny-random", rank=4).result()
    with pytest.raises(tinker.InternalServerError) as err:
        tc.optim_step(types.AdamParams()).result()
    assert err.value.status_code == 500 and retry._should_retry(err.value)
    assert [m for m, _ in svc.faults.raised] == ["sample", "sample", "optim_step"]


def test_async_forms_and_the_env_factory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLLM_TINKER_DOUBLE_DIR", str(tmp_path))
    monkeypatch.setenv("RLLM_TINKER_DOUBLE_MODELS", "tiny-random,Qwen/Qwen3-4B")
    monkeypatch.setenv("RLLM_TINKER_SERVICE", "rllm_backends.tinker.double:service_double_from_env")
    from rllm_backends.tinker.sdk import service_client

    svc = service_client()
    assert isinstance(svc, ServiceDouble) and svc.root == tmp_path and svc.base_models[1] == "Qwen/Qwen3-4B"
    assert isinstance(service_double_from_env(), ServiceDouble)

    async def run() -> float:
        tc = await svc.create_lora_training_client("Qwen/Qwen3-4B", rank=4)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = await (await tc.forward_backward_async([_datum([1, 2, 3, 4])], "cross_entropy"))
        assert any(issubclass(w.category, FutureWarning) for w in caught)
        sc = await tc.save_weights_and_get_sampling_client()
        res = await sc.sample(types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=1))
        assert len(res.sequences) == 1
        return out.metrics["loss:sum"]

    assert asyncio.run(run()) > 0
