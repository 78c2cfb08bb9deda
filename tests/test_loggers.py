"""Metric loggers (`rllm train --logger NAME`): the plugin hook, the group that fans out and survives a broken
logger, and the two built-ins written for real and read back with their own packages' readers (TensorBoard's
EventAccumulator; W&B's offline run file, parsed as the LevelDB-style log of protobuf Records it is)."""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from rllm_core.errors import ConfigError
from rllm_core.hookspecs import hookimpl
from rllm_core.loggers import LoggerGroup, LoggerSpec, get_loggers, metric_tag, open_loggers, scalar_metrics
from rllm_core.plugins import PluginManager
from rllm_train.config import load_config

CONFIG = {"model": "tiny-random", "lr": 1e-4, "group_size": 2, "loggers": ["tensorboard"]}


class Recorder:
    """A logger that remembers its calls; `fail_on` makes one method raise."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_on = fail_on

    def _call(self, method: str, payload: Any) -> None:
        self.calls.append((method, payload))
        if method == self.fail_on:
            raise OSError("disk full")

    def log_metrics(self, kind: str, step: int, metrics: Mapping[str, float]) -> None:
        self._call("log_metrics", (kind, step, dict(metrics)))

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._call("log_config", dict(config))

    def close(self) -> None:
        self._call("close", None)


def _manager(**factories: Any) -> PluginManager:
    """A plugin manager holding only a test plugin whose loggers are `factories` (name → factory)."""

    class Plugin:
        @hookimpl
        def rllm_register_loggers(self) -> list[LoggerSpec]:
            return [LoggerSpec(name, f, requires=f"rllm[{name}]") for name, f in factories.items()]

    pm = PluginManager(load_entry_points=False)
    pm.register(Plugin(), name="test-loggers")
    return pm


def test_builtin_loggers_are_registered_through_the_hook() -> None:
    pm = PluginManager()
    specs = get_loggers(pm)
    assert specs["tensorboard"].requires == "rllm[tensorboard]" and specs["wandb"].requires == "rllm[wandb]"
    assert {i.name: i.kinds for i in pm.infos}["tensorboard"] == ["logger"]


def test_unknown_logger_lists_the_installed_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        open_loggers(["tensorbord"], tmp_path, CONFIG)
    text = str(err.value)
    assert "unknown logger 'tensorbord'" in text and "did you mean tensorboard" in text
    assert "installed loggers: " in text and "tensorboard" in text and "wandb" in text
    assert len(open_loggers([], tmp_path, CONFIG)) == 0  # none asked: an empty group, nothing loaded


def test_a_missing_package_names_the_extra(tmp_path: Path) -> None:
    def needs_package(run_dir: Path) -> Any:
        import rllm_no_such_package  # type: ignore[import-not-found]  # noqa: F401

    opened = Recorder()
    pm = _manager(first=lambda run_dir: opened, fancy=needs_package)
    with pytest.raises(ConfigError) as err:
        open_loggers(["first", "fancy"], tmp_path, CONFIG, plugins=pm)
    assert 'needs rllm_no_such_package' in str(err.value) and 'pip install "rllm[fancy]"' in str(err.value)
    assert opened.calls == [("close", None)]  # what was opened before the error is closed, not leaked


def test_group_fans_out_numbers_only_and_a_failing_logger_is_disabled_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good, bad = Recorder(), Recorder(fail_on="log_metrics")
    seen_dirs: list[Path] = []

    def good_factory(run_dir: Path) -> Recorder:
        seen_dirs.append(run_dir)
        return good

    def broken_factory(run_dir: Path) -> Recorder:
        raise RuntimeError("service unreachable")

    pm = _manager(good=good_factory, bad=lambda run_dir: bad, broken=broken_factory, odd=lambda run_dir: 42)
    with caplog.at_level(logging.WARNING, logger="rllm.loggers"):
        group = open_loggers(["good", "bad", "good", "broken", "odd"], tmp_path, CONFIG, plugins=pm)
        assert group.names == ["good", "bad"] and seen_dirs == [tmp_path]  # repeats once; broken left out
        assert "'broken' could not start" in caplog.text and "'odd' is left out" in caplog.text
        record = {"reward/mean": 0.5, "train/grad_norm": 2, "skipped": "no trainable rows", "val/x": None,
                  "train/kl": math.nan, "ok": True}
        group.log("train", 1, record)
        group.log("eval", 1, {"val/reward/accuracy": 0.25})
        group.close()
        group.close()  # once only
    assert good.calls == [
        ("log_config", CONFIG),
        ("log_metrics", ("train", 1, {"reward/mean": 0.5, "train/grad_norm": 2.0, "ok": 1.0})),
        ("log_metrics", ("eval", 1, {"val/reward/accuracy": 0.25})),
        ("close", None),
    ]
    assert [m for m, _ in bad.calls] == ["log_config", "log_metrics", "close"]  # closed after its error, then gone
    failures = [r for r in caplog.records if "'bad' failed" in r.getMessage()]
    assert len(failures) == 1 and "disk full" in failures[0].getMessage() and failures[0].exc_info
    assert group.names == []


def test_tags_and_scalars() -> None:
    assert metric_tag("train", "reward/mean") == "train/reward/mean"
    assert metric_tag("train", "train/grad_norm") == "train/grad_norm"
    assert metric_tag("eval", "val/reward/accuracy") == "eval/val/reward/accuracy"
    assert scalar_metrics({"a": 1, "b": "x", "c": math.inf, "d": None, "e": 0.5}) == {"a": 1.0, "e": 0.5}


def test_tensorboard_event_file_reads_back_with_tensorboards_reader(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    group = open_loggers(["tensorboard"], tmp_path, CONFIG)
    train = [{"reward/mean": 0.25 * s, "train/grad_norm": 1.5 + s, "skipped": "x"} for s in (1, 2, 3)]
    for step, metrics in enumerate(train, start=1):
        group.log("train", step, metrics)
        if step in (1, 3):
            group.log("eval", step, {"val/reward/accuracy": step / 10})
    group.close()
    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"train/reward/mean", "train/grad_norm", "eval/val/reward/accuracy"}
    assert [(e.step, e.value) for e in acc.Scalars("train/reward/mean")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [(e.step, e.value) for e in acc.Scalars("train/grad_norm")] == [(1, 2.5), (2, 3.5), (3, 4.5)]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("eval/val/reward/accuracy")] == [(1, 0.1), (3, 0.3)]
    config_text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "lr: 0.0001" in config_text and "model: tiny-random" in config_text


def _wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf Records of a .wandb file: a 7-byte header (':W&B', magic, version), then LevelDB-log
    blocks of 32 KiB whose chunks carry (crc32, length, type) headers; types 1 full, 2-4 first/middle/last."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32 * 1024, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block  # a block's tail too short for a chunk header is padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No key, no mode, wandb's own caches inside tmp_path (never the user's home)."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))


def test_wandb_mode_is_offline_unless_online_is_asked_with_a_key(caplog: pytest.LogCaptureFixture) -> None:
    from rllm_loggers.wandb.logger import wandb_mode

    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}) == "offline"  # a key alone is not a request to go online
    assert wandb_mode({"WANDB_MODE": "disabled"}) == "disabled"
    assert wandb_mode({"WANDB_MODE": "online", "WANDB_API_KEY": "k"}) == "online"
    with caplog.at_level(logging.WARNING, logger="rllm.loggers"):
        assert wandb_mode({"WANDB_MODE": "online"}) == "offline"
    assert "WANDB_API_KEY is not set" in caplog.text


@pytest.mark.timeout(120)
def test_wandb_offline_run_holds_the_metrics(tmp_path: Path, wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")  # asked for, but without a key: must not touch the network
    run_dir = tmp_path / "arith-01"
    group = open_loggers(["wandb"], run_dir, CONFIG)
    group.log("eval", 0, {"val/reward/accuracy": 0.125})
    group.log("train", 1, {"reward/mean": 0.5, "train/grad_norm": 2.0, "skipped": "x"})
    group.log("train", 2, {"reward/mean": 0.75, "train/grad_norm": 1.0})
    group.log("eval", 2, {"val/reward/accuracy": 0.5})
    assert group.names == ["wandb"]
    group.close()
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    files = list(runs[0].glob("run-*.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    history, config = [], {}
    for record in _wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.append({k: v for k, v in row.items() if not k.startswith("_")})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update if item.key})
        elif kind == "run":
            assert record.run.project == "rllm" and record.run.display_name == "arith-01"
    assert history == [
        {"step": 0, "eval/val/reward/accuracy": 0.125},
        {"step": 1, "train/reward/mean": 0.5, "train/grad_norm": 2.0},
        {"step": 2, "train/reward/mean": 0.75, "train/grad_norm": 1.0},
        {"step": 2, "eval/val/reward/accuracy": 0.5},  # same step as the train record before it: kept
    ]
    assert config["lr"] == 1e-4 and config["model"] == "tiny-random"


def test_train_config_and_cli_take_logger_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(None, loggers="tensorboard, wandb,tensorboard").loggers == ["tensorboard", "wandb"]
    assert load_config(None).loggers == []
    seen: list[Any] = []

    def fake_train(config: Any, **kwargs: Any) -> Any:
        seen.append(config)
        return SimpleNamespace(run_dir=tmp_path / "my run", steps_done=1, last_checkpoint=None)

    import rllm_train.loop as loop
    from rllm.cli.app import build_app

    monkeypatch.setattr(loop, "train", fake_train)
    res = CliRunner().invoke(build_app(), ["train", "arithmetic", "--logger", "tensorboard", "--logger", "wandb",
                                           "--output", str(tmp_path / "my run"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert seen[0].loggers == ["tensorboard", "wandb"]
    out = " ".join(res.output.split())
    assert "done: 1 step" in out
    assert f"rllm view '{tmp_path}/my run'" in out and f"rllm plot '{tmp_path}/my run' -o curves.png" in out


def test_a_group_of_no_loggers_is_harmless() -> None:
    with LoggerGroup() as group:
        group.log("train", 1, {"reward/mean": 1.0})
    assert group.names == []


def test_a_training_run_with_logger_tensorboard_writes_every_record(tmp_path: Path) -> None:
    """`rllm train --logger tensorboard`: the loop sends each train/eval record to the logger too."""
    from rich.console import Console
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rllm_testing.fake_upstream import start_fake_upstream
    from rllm_testing.recording_backend import RecordingBackend
    from rllm_testing.training import YesNoBenchmark
    from rllm_train.loop import train
    from rllm_train.rundir import RunDir

    config = load_config(None, benchmark="yesno", batch_size=2, group_size=2, max_steps=2, eval_examples=2,
                         output=str(tmp_path / "run"), max_tokens=8, loggers=["tensorboard"])
    with start_fake_upstream() as upstream:
        train(config, backend=RecordingBackend(upstream.base_url), benchmark=YesNoBenchmark(), progress=False,
              console=Console(quiet=True))
    records = [m for m in RunDir(tmp_path / "run").read_metrics() if m["kind"] == "train"]
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    steps = [e.step for e in events.Scalars(metric_tag("train", "reward/mean"))]
    assert steps == [m["step"] for m in records] == [1, 2]
    assert any(tag.startswith("eval/") for tag in events.Tags()["scalars"])
