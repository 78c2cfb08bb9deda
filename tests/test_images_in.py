"""Images in (issue 35, first part): the generated geometry benchmark, a run's media store (images once, by
content, never base64 in episodes), and a text-only model refusing an image by name (`bad_input`), never
answering without it."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import pytest

from rllm_core.runs.episodes import EpisodeWriter
from rllm_core.runs.media import MEDIA_SCHEME, externalize_media, inline_media, media_bytes
from rllm_envs.benchmarks import get_benchmark
from rllm_envs.benchmarks.geometry_figures import KINDS, draw_figure, image_part
from rllm_envs.eval.runner import EvalOptions, run_eval
from rllm_monitor.server import start_view_server
from rllm_serve.app import refuse_media
from rllm_serve.protocol import RequestError


def _png(task_messages: list[dict]) -> bytes:
    url = task_messages[0]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    return base64.b64decode(url.split(",", 1)[1])


def test_geometry_figures_are_drawn_offline_with_computed_answers_and_disjoint_splits() -> None:
    from PIL import Image

    bench = get_benchmark("geometry-figures")
    test, train = bench.load("test"), bench.load("train", max_examples=400)
    assert len(test) == 200 and {t.metadata["kind"] for t in test} == set(KINDS)
    key = [(t.metadata["kind"], json.dumps(t.metadata["values"], sort_keys=True)) for t in test]
    assert not set(key) & {(t.metadata["kind"], json.dumps(t.metadata["values"], sort_keys=True)) for t in train}
    for task in test[:10]:
        text = task.instruction[0]["content"][0]["text"]
        values = task.metadata["values"]
        assert not any(str(v) in text for v in values.values() if isinstance(v, int))  # numbers only in the image
        image = Image.open(io.BytesIO(_png(task.instruction)))
        assert image.size == (320, 240)
        assert bench.grade(task, f"x = {task.ground_truth}").is_correct
        assert not bench.grade(task, str(int(task.ground_truth) + 1)).is_correct
    right = next(t for t in test if t.metadata["kind"] == "right_triangle")
    a, b = right.metadata["values"]["a"], right.metadata["values"]["b"]
    assert int(right.ground_truth) ** 2 == a * a + b * b
    assert draw_figure("circle", {"r": 5}) == draw_figure("circle", {"r": 5})  # deterministic bytes


def test_a_runs_images_are_stored_once_by_content_and_read_back(tmp_path: Path) -> None:
    png = draw_figure("rectangle", {"w": 3, "h": 4})
    part = image_part(png)
    anthropic = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(png).decode()}}
    episode = {"task": {"instruction": [{"role": "user", "content": [part]}]},
               "trajectories": [{"steps": [{"messages": [{"role": "user", "content": [part]}]},
                                           {"messages": [{"role": "user", "content": [anthropic]}]}]}]}
    with EpisodeWriter(tmp_path / "run" / "episodes.jsonl") as writer:
        writer.write(episode)
        writer.write(json.dumps(episode))
    text = (tmp_path / "run" / "episodes.jsonl").read_text()
    assert "base64," not in text and base64.b64encode(png).decode()[:40] not in text
    stored = list((tmp_path / "run" / "media").iterdir())
    assert len(stored) == 1 and stored[0].read_bytes() == png  # six mentions, one file
    ref = json.loads(text.splitlines()[0])["task"]["instruction"][0]["content"][0]["image_url"]["url"]
    assert ref.startswith(MEDIA_SCHEME) and media_bytes(ref, tmp_path / "run" / "media") == png
    assert inline_media(json.loads(text.splitlines()[0]), tmp_path / "run" / "media") == episode
    train_media = tmp_path / "train" / "media"
    with EpisodeWriter(tmp_path / "train" / "episodes" / "step_1.jsonl") as writer:
        writer.write(episode)
    assert [p.name for p in train_media.iterdir()] == [stored[0].name]  # a train run's media sit at its root
    plain = json.dumps({"task": {"instruction": "2 + 2"}})
    assert externalize_media(plain, tmp_path / "x") == plain and not (tmp_path / "x").exists()


def test_a_text_only_model_refuses_an_image_by_name() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "what?"},
                                             image_part(draw_figure("circle", {"r": 2}))]}]
    with pytest.raises(RequestError, match=r"reads text only.*'image_url'"):
        refuse_media(messages, "smollm2-135m")
    refuse_media(messages, "smolvlm", processor=object())  # a model with a processor takes it
    refuse_media([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "m")  # text parts are text


def test_an_image_for_a_text_only_model_is_a_bad_input_episode_not_a_crash(tmp_path: Path) -> None:
    result = run_eval(EvalOptions(benchmark="geometry-figures", max_examples=3, model="tiny-random",
                                  output=tmp_path / "run", progress=False))
    assert result.summary.reasons == {"bad_input": 3}
    episodes = [json.loads(line) for line in result.episodes_path.read_text().splitlines()]
    assert all("reads text only" in e["error"] for e in episodes)
    stored = sorted(p.name for p in (tmp_path / "run" / "media").iterdir())
    assert len(stored) == 3  # the task images, stored once each
    with start_view_server(tmp_path / "run") as server, httpx.Client(base_url=server.url, timeout=60) as client:
        file = client.get("/api/files", params={"run": "."}).json()["files"][0]["name"]
        shown = client.get("/api/episode", params={"run": ".", "file": file, "index": 0}).json()
        first = shown["trajectories"][0]["steps"][0]["messages"][0]
        assert first["images"][0] in stored and "base64" not in json.dumps(shown)
        image = client.get("/api/media", params={"run": ".", "name": first["images"][0]})
        assert image.status_code == 200
        assert image.content == (tmp_path / "run" / "media" / first["images"][0]).read_bytes()
        assert client.get("/api/media", params={"run": ".", "name": "../config.yaml"}).status_code == 400


def test_geo3k_rows_become_an_image_and_a_question_and_offline_it_says_what_it_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    from rllm_envs.benchmarks.hub_sets import _geo3k

    diagram = Image.new("RGB", (40, 30), "white")
    buf = io.BytesIO()
    diagram.save(buf, format="PNG")
    for image in (diagram, {"bytes": buf.getvalue(), "path": None}):  # as `datasets` decodes it, or raw
        messages, gold, _ = _geo3k({"problem": "<image>Find x in the figure.", "answer": "12", "images": [image]})
        parts = messages[0]["content"]
        assert parts[0]["type"] == "image_url" and "<image>" not in parts[1]["text"] and gold == "12"
        png = base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1])
        assert Image.open(io.BytesIO(png)).size == (40, 30)
    folder = tmp_path / "geo3k"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps({"problem": "<image>Find x.", "answer": "3",
                                                   "images": [parts[0]["image_url"]["url"]]}) + "\n")
    task = get_benchmark("geo3k").load("test", data_dir=str(tmp_path))[0]
    assert task.instruction[0]["content"][0]["image_url"]["url"] == parts[0]["image_url"]["url"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(Exception, match="needs the Hugging Face dataset 'hiyouga/geometry3k'"):
        get_benchmark("geo3k").load("train", max_examples=2)


def test_every_api_of_the_policy_server_refuses_an_image_for_a_text_only_model() -> None:
    from rllm_serve import start_policy_server

    url = image_part(draw_figure("circle", {"r": 3}))["image_url"]["url"]
    b64 = url.split(",", 1)[1]
    chat_parts = [{"type": "text", "text": "x?"}, {"type": "image_url", "image_url": {"url": url}}]
    responses_parts = [{"type": "input_text", "text": "x?"}, {"type": "input_image", "image_url": url}]
    bodies = {
        "/v1/chat/completions": {"model": "tiny-random", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": chat_parts}]},
        "/v1/responses": {"model": "tiny-random", "max_output_tokens": 4,
                          "input": [{"role": "user", "content": responses_parts}]},
        "/v1/messages": {"model": "tiny-random", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": b64}}]}]},
    }
    with start_policy_server("tiny-random", max_batch_size=2) as server:
        for path, body in bodies.items():
            reply = httpx.post(server.url + path, json=body, timeout=60)
            assert reply.status_code == 400, (path, reply.text)
            assert "image" in reply.text, (path, reply.text)


def test_geometry_shapes_asks_which_figure_with_chance_a_quarter_and_grades_the_first_shape_named() -> None:
    from collections import Counter

    bench = get_benchmark("geometry-shapes")
    train, test = bench.load("train", max_examples=40), bench.load("test", max_examples=20)
    assert Counter(t.ground_truth for t in test) == {"circle": 5, "triangle": 5, "lines": 5, "rectangle": 5}
    assert not {_png(t.instruction) for t in train} & {_png(t.instruction) for t in test}
    task = test[0]
    assert bench.grade(task, bench.reference_response(task)).is_correct
    other = next(t for t in test if t.ground_truth != task.ground_truth)
    assert not bench.grade(other, bench.reference_response(task)).is_correct
    assert bench.grade(other, "I see a " + other.ground_truth.rstrip("s") + ".").is_correct  # "line" is "lines"
    assert bench.grade(task, "no idea").reason == "no_answer_extracted"
