"""Images in, served and trained (issue 35), for both families: a tiny random SmolVLM (`tiny-vlm`: Idefics3 built
from its config in code, SmolLM2's tokenizer plus SmolVLM's image tokens) and a tiny random Qwen2-VL
(`tiny-qwen2-vl`: 3-D rotary positions), served by the policy server with exact ids and logprobs, captured
in-process and through the gateway, trained (full and LoRA) with the trainer's logprobs equal to the server's; bad
images are one-line 400s and `bad_input` episodes."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import rllm
from rllm_core.types import Trajectory
from rllm_envs.benchmarks.geometry_figures import draw_figure, image_part
from rllm_rollout.gateway import UpstreamConfig, start_gateway
from rllm_serve.vision import decode_image, fetch_image, hf_messages

CIRCLE = image_part(draw_figure("circle", {"r": 3}))
TRIANGLE = image_part(draw_figure("triangle_angle", {"a": 50, "b": 60}))
QUESTION = {"type": "text", "text": "What is the radius?"}


FAMILIES = ["tiny-vlm", "tiny-qwen2-vl"]


@pytest.fixture(scope="module", params=FAMILIES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(name: str) -> Iterator[Any]:
    from rllm_serve import load_model, start_policy_server

    with start_policy_server(load_model(name), max_batch_size=4) as s:
        yield s


@pytest.fixture(scope="module")
def reference(name: str) -> Any:
    from rllm_serve import load_model

    return load_model(name)


def _chat(server: Any, messages: list[dict], **extra: Any) -> httpx.Response:
    body = {"model": server.model_name, "max_tokens": 6, "messages": messages, "return_token_ids": True,
            "logprobs": True, **extra}
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=120)


def _processed(ref: Any, messages: list[dict]) -> Any:
    """What transformers' own processor makes of these messages (the reference the server must equal)."""
    import asyncio

    parts, sources = hf_messages(messages)
    images = [decode_image(asyncio.run(fetch_image(s))) for s in sources]
    text = ref.tokenizer.apply_chat_template(parts, tokenize=False, add_generation_prompt=True)
    return ref.processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)


def _reference_logprobs(ref: Any, inputs: Any, completion: list[int]) -> list[float]:
    """Logprobs of `completion` by transformers' full forward with the pixel values (its own image merge)."""
    prompt = inputs["input_ids"][0].tolist()
    extras = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    if "mm_token_type_ids" in extras:  # Qwen2-VL: which tokens are image tokens, for its 3-D positions
        kinds = extras["mm_token_type_ids"]
        extras["mm_token_type_ids"] = torch.cat([kinds, kinds.new_zeros(1, len(completion))], 1)
    with torch.no_grad():
        logits = ref.model(input_ids=torch.tensor([prompt + completion]), **extras).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def test_the_server_expands_images_as_the_processor_does_and_samples_with_exact_logprobs(
        server: Any, reference: Any) -> None:
    messages = [{"role": "user", "content": [CIRCLE, QUESTION]}]
    reply = _chat(server, messages, n=2, seed=7, temperature=1.0)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    inputs = _processed(reference, messages)
    image_token = reference.model.config.image_token_id
    assert body["prompt_token_ids"] == inputs["input_ids"][0].tolist()
    # tiny-vlm: 64×64, 16-px patches, pixel shuffle 2 → 4; tiny-qwen2-vl: ≤ 56×56·4 px, 14-px patches merged 2×2
    assert body["prompt_token_ids"].count(image_token) == {"tiny-vlm": 4}.get(server.model_name, 12)
    for choice in body["choices"]:
        served = [c["logprob"] for c in choice["logprobs"]["content"]]
        mine = _reference_logprobs(reference, inputs, choice["token_ids"])
        assert max(abs(a - b) for a, b in zip(served, mine, strict=True)) < 1e-4


def test_the_same_text_with_another_image_is_never_served_from_the_first_ones_kv(server: Any, reference: Any) -> None:
    """Image tokens have the same ids for every image: the prefix cache must key them by the image too."""
    outs = []
    for image in (CIRCLE, TRIANGLE, CIRCLE):
        messages = [{"role": "user", "content": [image, QUESTION]}]
        body = _chat(server, messages, temperature=0).json()
        lps = [c["logprob"] for c in body["choices"][0]["logprobs"]["content"]]
        mine = _reference_logprobs(reference, _processed(reference, messages), body["choices"][0]["token_ids"])
        assert max(abs(a - b) for a, b in zip(lps, mine, strict=True)) < 1e-4
        outs.append(body["prompt_token_ids"])
    assert outs[0] == outs[1] == outs[2]  # same ids, different images: only the features differ


def test_responses_and_messages_apis_take_their_own_image_parts(server: Any) -> None:
    url = CIRCLE["image_url"]["url"]
    chat = _chat(server, [{"role": "user", "content": [CIRCLE, QUESTION]}], temperature=0).json()
    responses = httpx.post(server.base_url + "/responses", timeout=120, json={
        "model": server.model_name, "max_output_tokens": 6, "temperature": 0,
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": url},
                                               {"type": "input_text", "text": QUESTION["text"]}]}]})
    messages = httpx.post(server.base_url + "/messages", timeout=120, json={
        "model": server.model_name, "max_tokens": 6, "temperature": 0, "return_token_ids": True,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": url.split(",", 1)[1]}},
            {"type": "text", "text": QUESTION["text"]}]}]})
    assert responses.status_code == 200 and messages.status_code == 200, (responses.text, messages.text)
    assert responses.json()["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert messages.json()["prompt_token_ids"] == chat["prompt_token_ids"]


def _png_of_size(w: int, h: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), "white").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_bad_images_are_one_line_400s_and_the_server_keeps_serving(server: Any, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    from rllm_serve import vision

    monkeypatch.setattr(vision, "MAX_IMAGE_PIXELS", 100 * 100)
    bad = {
        "http://127.0.0.1:9/figure.png": "cannot be fetched",
        "data:image/png;base64," + base64.b64encode(b"not a png at all").decode(): "cannot be decoded",
        _png_of_size(300, 200): "300×200 pixels",
        "ftp://example.org/x.png": "neither a data: URL nor http",
    }
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    reply = _chat(server, [{"role": "user", "content": [CIRCLE, audio]}])
    assert reply.status_code == 400 and "'input_audio' part" in reply.text  # never dropped silently
    for url, why in bad.items():
        reply = _chat(server, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
        assert reply.status_code == 400, reply.text
        message = reply.json()["error"]["message"]
        assert why in message and "\n" not in message
    monkeypatch.undo()
    assert _chat(server, [{"role": "user", "content": [CIRCLE, QUESTION]}]).status_code == 200


def test_a_bad_image_in_a_benchmark_is_a_bad_input_episode_not_a_crash(tmp_path: Path, name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from rllm_envs.benchmarks import geometry_figures
    from rllm_envs.eval.runner import EvalOptions, run_eval

    monkeypatch.setattr(geometry_figures, "image_part", lambda png: {
        "type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png[:40]).decode()}})
    result = run_eval(EvalOptions(benchmark="geometry-figures", max_examples=2, model=name,
                                  output=tmp_path / "run", progress=False))
    assert result.summary.reasons == {"bad_input": 2}


@rllm.rollout
def looks_at_the_figure(task: rllm.Task, config: rllm.RolloutConfig) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=config.base_url, api_key="EMPTY")  # an agent written the usual way
    r = client.chat.completions.create(model=config.model, max_tokens=6,
                                       messages=[{"role": "user", "content": [CIRCLE, QUESTION]}])
    return r.choices[0].message.content or ""


@pytest.mark.parametrize("through_gateway", [False, True], ids=["in_process", "gateway"])
def test_a_multimodal_episode_is_captured_with_the_expanded_ids_and_its_image(
        server: Any, reference: Any, through_gateway: bool) -> None:
    task = rllm.Task(id="fig", instruction="look")
    if through_gateway:
        with start_gateway([UpstreamConfig(url=server.base_url)]) as gw:
            episode = looks_at_the_figure.run(task, gateway=gw, model=server.model_name)
    else:
        episode = looks_at_the_figure.run(task, base_url=server.base_url, model=server.model_name)
    assert episode.error is None, episode.error
    [step] = episode.steps
    expected = _processed(reference, [{"role": "user", "content": [CIRCLE, QUESTION]}])["input_ids"][0].tolist()
    assert step.prompt_token_ids == expected and step.token_source == "server"
    assert step.messages is not None and step.messages[0]["content"][0] == CIRCLE  # the image, recorded
    assert step.logprobs and len(step.logprobs) == len(step.completion_token_ids or [])


def _rows(server: Any, n: int = 4) -> list[Any]:
    """Training rows of real sampled episodes (two figures, two samples each), advantages ±1."""
    from rllm_train.packing import pack_trajectory

    rows = []
    for i, image in enumerate((CIRCLE, TRIANGLE)[: n // 2] * 1):
        messages = [{"role": "user", "content": [image, QUESTION]}]
        body = _chat(server, messages, n=2, temperature=1.0, seed=i).json()
        for j, choice in enumerate(body["choices"]):
            step = rllm.Step(messages=messages, prompt_token_ids=body["prompt_token_ids"],
                             completion_token_ids=choice["token_ids"], token_source="server",
                             logprobs=[c["logprob"] for c in choice["logprobs"]["content"]],
                             params={"temperature": 1.0})
            rows += pack_trajectory(Trajectory(steps=[step]), 1.0 if j == 0 else -1.0, group_id=str(i))[0]
    return rows


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_training_steps_score_as_the_server_sampled_and_train_the_text_side(server: Any, name: str,
                                                                               lora: bool) -> None:
    from rllm_backends.local_torch.trainer import TorchTrainer
    from rllm_serve import load_model
    from rllm_train.config import TrainConfig

    rows = _rows(server)
    assert all(r.images == [rows[0].images[0]] or r.images == [TRIANGLE["image_url"]["url"]] for r in rows)
    loaded = load_model(name)
    config = TrainConfig(benchmark="x", model=name, lr=1e-5, lora_rank=4 if lora else 0, bf16=False)
    trainer = TorchTrainer(loaded.model, config, processor=loaded.processor)
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    vision_parts = ("vision_model", "connector", "visual")
    assert names and not any(part in n for part in vision_parts for n in names)  # frozen / no LoRA there
    assert all("lora_" in n for n in names) == lora
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.model.eval()
    with torch.no_grad():
        start = min(r.loss_mask.index(1) for r in rows)
        logp_BT, _, _ = trainer._score_packed(rows, start, 1.0)
    for b, row in enumerate(rows):
        for j, m in enumerate(row.loss_mask):
            if m:
                assert abs(float(logp_BT[b, j - start]) - row.sampling_logprobs[j]) < 1e-4
    first, second = trainer.train_step(rows), trainer.train_step(rows)
    assert abs(first["train/mismatch_kl"]) < 1e-6  # before any update the trainer is the sampler
    assert first["train/grad_norm"] > 0 and second["train/grad_norm"] > 0
    assert abs(second["train/mismatch_kl"]) > 1e-6  # the first update moved the policy
    after = dict(trainer.model.named_parameters())
    changed = [n for n in names if not torch.equal(before[n], after[n].detach())]
    assert changed
    vision = [n for n in before if any(part in n for part in vision_parts)]
    assert vision and all(torch.equal(before[n], after[n].detach()) for n in vision)


def test_rllm_train_and_eval_a_vision_model_on_the_generated_benchmark(tmp_path: Path, reference: Any,
                                                                      name: str) -> None:
    """The whole path a user runs: 2 LoRA steps on geometry-figures, then `rllm eval` of the run (checkpoint with
    its processor, LoRA on the text decoder), episodes holding image tokens and stored images."""
    import json

    from typer.testing import CliRunner

    from rllm.cli.app import build_app
    from rllm_core.io import read_jsonl
    from rllm_envs.eval.runner import EvalOptions, run_eval

    run = tmp_path / "run"
    res = CliRunner().invoke(build_app(), [
        "train", "geometry-figures", "--model", name, "--lora-rank", "4", "--max-steps", "2",
        "--batch-size", "2", "--group-size", "2", "--max-tokens", "8", "--eval-examples", "0", "--no-bf16",
        "--no-progress", "--output", str(run)])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert abs(train[0]["train/mismatch_kl"]) < 1e-5  # the trainer scored the image rows as the server sampled
    assert (run / "checkpoints" / "step_2" / "processor_config.json").is_file()
    result = run_eval(EvalOptions(benchmark="geometry-figures", model=str(run), max_examples=2,
                                  output=tmp_path / "eval", progress=False, max_tokens=8))
    assert result.summary.n_episodes == 2 and result.summary.errors == 0
    for ep in read_jsonl(result.episodes_path):
        [step] = ep.steps
        assert reference.model.config.image_token_id in (step.prompt_token_ids or [])  # expanded by the server
        url = step.messages[0]["content"][1]["image_url"]["url"]
        assert url.startswith("rllm-media://") and (tmp_path / "eval" / "media" / url.split("//")[1]).is_file()


def test_verl_gets_each_rows_images_as_multi_modal_inputs_and_tinker_refuses_images_by_name(
        server: Any, reference: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from rllm_backends.verl.batch import VerlBatchError, rows_to_dataproto
    from rllm_serve.vision import pixel_inputs
    from rllm_train.backend import check_images, create_backend
    from rllm_train.config import TrainConfig

    rows = _rows(server)
    data = rows_to_dataproto(rows, pad_token_id=0, multi_modal=lambda r: pixel_inputs(reference.processor, r.images))
    inputs = data.non_tensor_batch["multi_modal_inputs"]
    assert isinstance(inputs, np.ndarray) and len(inputs) == len(rows)
    for row, mm in zip(rows, inputs, strict=True):
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": row.images[0]}},
                                                 QUESTION]}]
        assert torch.equal(mm["pixel_values"], _processed(reference, messages)["pixel_values"])
    with pytest.raises(VerlBatchError, match="no processor"):
        rows_to_dataproto(rows, pad_token_id=0)
    monkeypatch.setenv("TINKER_API_KEY", "not-used: capabilities only")
    tinker = create_backend("tinker", TrainConfig(benchmark="x", model=server.model_name, backend="tinker"))
    with pytest.raises(Exception, match=r"backend 'tinker' cannot train on images \(4 rows.*no image chunks"):
        check_images(rows, tinker.capabilities(), tinker.name)
    local = create_backend("local", TrainConfig(benchmark="x", model=server.model_name))
    check_images(rows, local.capabilities(), local.name)  # the local backend trains them


def test_a_vision_model_directory_loads_back_with_its_processor(name: str, reference: Any) -> None:
    """What vLLM or a full checkpoint loads: the model directory, its processor beside it (Qwen2-VL's images-only,
    since its video processor needs torchvision)."""
    from rllm_serve.models import load_model, model_dir

    loaded = load_model(model_dir(name))
    assert type(loaded.processor).__name__ == type(reference.processor).__name__
    assert loaded.tokenizer.chat_template == reference.tokenizer.chat_template
    mine, theirs = loaded.model.state_dict(), reference.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_reference_demos_of_an_image_benchmark_become_sft_rows_as_the_server_would_tokenize_them(
        tmp_path: Path, server: Any, reference: Any, name: str) -> None:
    """`rllm demos geometry-shapes` (the answer oracle: no token ids) → `rllm sft` rows rendered with the VLM's
    processor from the stored images (read back from the run's media), the prompt ids the server expands."""
    from typer.testing import CliRunner

    from rllm.cli.app import build_app
    from rllm_train.sft_data import EpisodeFilter, sft_rows_from_episodes

    demos = tmp_path / "demos"
    res = CliRunner().invoke(build_app(), ["demos", "geometry-shapes", "-n", "4", "-o", str(demos), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "base64" not in (demos / "episodes.jsonl").read_text()  # images stored once, referenced
    rows, counts = sft_rows_from_episodes(demos, EpisodeFilter(min_reward=1.0), tokenizer=lambda: reference.tokenizer,
                                          processor=lambda: reference.processor)
    assert len(rows) == 4 and counts["episodes_kept"] == 4
    for row in rows:
        [image] = row.images
        messages = [{"role": "user", "content": [{"type": "text", "text": "Which figure is drawn: a circle, a "
                                                  "triangle, lines or a rectangle? Answer with one word."},
                                                 {"type": "image_url", "image_url": {"url": image}}]}]
        served = _chat(server, messages, temperature=0).json()["prompt_token_ids"]
        cut = row.loss_mask.index(1)
        assert row.tokens[:cut] == served
        answer = reference.tokenizer.decode(row.tokens[cut:], skip_special_tokens=True)
        assert answer.lower() in ("circle", "triangle", "lines", "rectangle")
