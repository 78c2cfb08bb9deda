"""Renamed variants of Harbor tasks for demonstrations (rllm_envs/demos/task_variants.py, `rllm demos
--task-variants`): names under /app change everywhere at once, and the verifier decides which variants are valid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_envs.demos.task_variants import app_names, write_variants
from rllm_envs.terminal.benchmark import TASKS_DIR


def _task(root: Path) -> Path:
    task = root / "copy-bundle"
    for sub in ("environment/data", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n[metadata]\nsplit = "train"\n')
    (task / "instruction.md").write_text("Clone `/app/project.bundle` into `/app/project`, then copy every file of "
                                         "`/app/data` to `/app/out.txt`.\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\nCOPY data /app/data\n"
                                                     "COPY project.bundle /app/project.bundle\n")
    (task / "environment" / "data" / "a.txt").write_text("see /app/data/a.txt and /app/database\n")
    (task / "environment" / "project.bundle").write_bytes(b"\xff\xfe binary /app/project")
    (task / "solution" / "solve.sh").write_text("git clone /app/project.bundle /app/project\ncat /app/data/* > "
                                                "/app/out.txt\n")
    (task / "tests" / "test.sh").write_text("echo 0 > /logs/verifier/reward.txt\ntest -s /app/out.txt\n")
    return task


def test_every_name_under_app_is_renamed_in_every_file_and_nothing_else(tmp_path: Path) -> None:
    src = _task(tmp_path / "src")
    assert app_names((src / "instruction.md").read_text()) == ["data", "out.txt", "project", "project.bundle"]
    made = write_variants([src], tmp_path / "out", per_task=3, seed=1)
    assert [p.name for p in made] == ["copy-bundle-v1", "copy-bundle-v2", "copy-bundle-v3"]
    instructions = {(p / "instruction.md").read_text() for p in made}
    assert len(instructions) == 3  # three different sets of names: three tasks an oracle can tell apart
    for variant in made:
        text = (variant / "instruction.md").read_text()
        record = json.loads((variant / "variant.json").read_text())
        new = record["renamed"]
        assert record["variant_of"] == "copy-bundle" and sorted(app_names(text)) == sorted(new.values())
        assert set(new.values()).isdisjoint({"data", "out.txt", "project", "project.bundle"})
        assert new["out.txt"].endswith(".txt") and new["project.bundle"].endswith(".bundle")
        solve = (variant / "solution" / "solve.sh").read_text()
        assert "/app/project" not in solve and "/app/data" not in solve and "/app/out.txt" not in solve
        assert f"/app/{new['out.txt']}" in solve and f"/app/{new['project.bundle']} /app/{new['project']}" in solve
        docker = (variant / "environment" / "Dockerfile").read_text()
        assert f"COPY {new['data']} /app/{new['data']}\n" in docker
        assert (variant / "environment" / new["data"] / "a.txt").is_file()
        assert (variant / "environment" / new["project.bundle"]).read_bytes() == b"\xff\xfe binary /app/project"
        moved = (variant / "environment" / new["data"] / "a.txt").read_text()
        assert moved == f"see /app/{new['data']}/a.txt and /app/database\n"  # a longer name is another name
        test_sh = (variant / "tests" / "test.sh").read_text()
        assert test_sh.startswith("echo 0 > /logs/verifier/reward.txt\n")  # paths outside /app never change
    assert (src / "solution" / "solve.sh").read_text().startswith("git clone /app/project.bundle")  # source intact


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap (.ci/run installs it)")
def test_rllm_demos_plays_the_variants_and_their_verifiers_judge_them(tmp_path: Path) -> None:
    out = tmp_path / "demos"
    result = CliRunner().invoke(build_app(), ["demos", "terminal", "-n", "3", "--task-variants", "2", "-o",
                                              str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    ids = sorted(e["task"]["id"] for e in episodes)
    originals = sorted(p.name for p in sorted(TASKS_DIR.iterdir()) if p.is_dir())
    train = [t for t in originals if '"heldout"' not in (TASKS_DIR / t / "task.toml").read_text()][:3]
    assert ids == sorted([*train, *(f"{t}-v{k}" for t in train for k in (1, 2))])
    assert all(e["task"]["split"] == "train" for e in episodes)
    passed = {e["task"]["id"] for e in episodes if e["reward"] == 1.0}
    assert set(train) <= passed  # the originals always pass; which variants pass is the verifiers' word
    assert len(passed) >= 6, sorted(passed)
    assert sorted(p.name for p in (out / "tasks").iterdir()) == ids  # the run keeps what it demonstrated


def test_task_variants_need_a_harbor_task_set(tmp_path: Path) -> None:
    result = CliRunner().invoke(build_app(), ["demos", "frozenlake-3x3", "-n", "2", "--task-variants", "1", "-o",
                                              str(tmp_path / "x")])
    assert result.exit_code == 2 and "Harbor tasks" in result.output
