"""`rllm view`'s HTTP API over real run directories: a 2-step `tiny-random` training run and an eval against the
local policy server, built once for the module, plus a hand-written run for the edge cases (long text, an
episode without token ids, a half-written metrics line). Every endpoint, token auth, and the refusals
(non-local host without a token, port in use, a folder that is not a run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from rllm.cli.app import build_app
from rllm_core.errors import ConfigError
from rllm_monitor.api import MAX_LIMIT
from rllm_monitor.diagnosis import is_zero
from rllm_monitor.server import ViewServer, start_view_server
from rllm_monitor.tokens import MAX_TEXT

pytestmark = pytest.mark.slow  # one real training run and one real eval for the module (~30 s)


def _episodes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_synthetic_run(run: Path) -> None:
    """A train run written by hand (no sidecar: the reader scans): five episodes with known reasons, one with a
    30,000-character prompt, and a metrics file whose last line is cut mid-write."""
    (run / "episodes").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"format": 1, "kind": "train", "started": time.time(), "pid": 1,
                                              "host": "elsewhere", "argv": ["rllm", "train"]}))
    (run / "config.yaml").write_text("benchmark: arithmetic\nmodel: tiny-random\nbackend: local\nmax_steps: 1\n")
    (run / "heartbeat.json").write_text(json.dumps({"time": time.time(), "status": "finished", "step": 1}))
    (run / "log.txt").write_text("".join(f"line {i}\n" for i in range(30)))
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "time": time.time(),
                                                   "reward/mean": 0.2}) + "\n" + '{"kind": "train", "st')

    def ep(i: int, task: str, reward: float, reason: str, ids: list[int] | None, error: str | None = None,
           prompt: str = "What is 1+1?") -> dict[str, Any]:
        step = {"messages": [{"role": "user", "content": prompt}], "text": f"answer {i}",
                "completion_token_ids": ids, "logprobs": [-0.5] * len(ids) if ids else None,
                "prompt_token_ids": [1, 2] if ids else None, "token_source": "server" if ids else "none"}
        return {"id": f"e{i}", "task": {"id": task, "instruction": prompt}, "reward": reward,
                "reward_reason": reason, "is_correct": reward > 0, "error": error,
                "trajectories": [{"name": "solver", "steps": [step]}]}

    eps = [ep(0, "t1", 1.0, "correct", [5, 6]), ep(1, "t1", 0.0, "wrong_answer", [7]),
           ep(2, "t2", 0.0, "wrong_answer", [8], prompt="x" * 30_000),
           ep(3, "t2", 0.0, "error", [], error="agent crashed: boom"),
           ep(4, "t3", 0.0, "wrong_answer", None)]
    (run / "episodes" / "step_1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/train (rllm train, local backend, 2 steps, validation at step 2), root/eval (run_eval against the
    policy server), root/synthetic/hand (the edge cases), all real files."""
    from rllm_envs.eval.runner import EvalOptions, run_eval
    from rllm_serve import start_policy_server
    from rllm_train.config import load_config
    from rllm_train.loop import train

    root = tmp_path_factory.mktemp("runs")
    config = load_config(None, benchmark="arithmetic", model="tiny-random", batch_size=2, group_size=2,
                         max_tokens=8, max_steps=2, eval_every=2, eval_examples=2, seed=3, output=str(root / "train"))
    train(config, progress=False, console=Console(quiet=True))
    with start_policy_server("tiny-random") as server:
        run_eval(EvalOptions(benchmark="arithmetic", base_url=server.base_url, model="tiny-random", max_examples=3,
                             max_tokens=8, output=root / "eval", progress=False))
    _write_synthetic_run(root / "synthetic" / "hand")
    return root


@pytest.fixture(scope="module")
def server(runs_root: Path) -> Iterator[ViewServer]:
    with start_view_server(runs_root) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ViewServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _get(client: httpx.Client, path: str, status: int = 200, **params: Any) -> Any:
    resp = client.get(path, params=params)
    assert resp.status_code == status, resp.text
    return resp.json()


def test_runs_lists_train_eval_and_nested_runs(client: httpx.Client, runs_root: Path) -> None:
    body = _get(client, "/api/runs")
    assert body["root"] == str(runs_root.resolve())
    runs = {r["id"]: r for r in body["runs"]}
    assert set(runs) == {"train", "eval", "synthetic/hand"}
    train, ev = runs["train"], runs["eval"]
    assert train["kind"] == "train" and train["status"] == "finished" and train["step"] == 2
    assert train["model"] == "tiny-random" and train["benchmark"] == "arithmetic" and train["max_steps"] == 2
    assert ev["kind"] == "eval" and ev["status"] == "finished" and ev["accuracy"] is not None


def test_metrics_whole_then_incremental(client: httpx.Client, runs_root: Path) -> None:
    body = _get(client, "/api/metrics", run="train")
    written = _episodes(runs_root / "train" / "metrics.jsonl")
    assert body["records"] == written and body["partial_lines"] == 0
    assert [r["kind"] for r in body["records"]].count("train") == 2 and "eval" in {r["kind"] for r in written}
    again = _get(client, "/api/metrics", run="train", since=body["next"])
    assert again["records"] == [] and again["next"] == body["next"]
    assert _get(client, "/api/metrics", run="eval")["records"][0]["kind"] == "eval"


def test_a_truncated_metrics_line_is_shown_as_partial(client: httpx.Client) -> None:
    body = _get(client, "/api/metrics", run="synthetic/hand")
    assert len(body["records"]) == 1 and body["records"][0]["reward/mean"] == 0.2
    assert body["partial_lines"] == 1


def test_polling_metrics_sees_what_a_running_run_appends(runs_root: Path, tmp_path: Path) -> None:
    """The page's live loop: since=next returns only new records; the cut line counts once it is complete."""
    run = tmp_path / "live"
    shutil.copytree(runs_root / "synthetic" / "hand", run)
    (run / "heartbeat.json").write_text(json.dumps({"time": time.time(), "status": "running", "step": 1}))
    with start_view_server(run) as s, httpx.Client(base_url=s.url) as c:
        assert c.get("/api/runs").json()["runs"][0]["status"] == "running"
        first = c.get("/api/metrics", params={"run": "."}).json()
        assert (len(first["records"]), first["next"], first["partial_lines"]) == (1, 1, 1)
        with open(run / "metrics.jsonl", "a") as f:
            f.write('ep": 2, "time": 1.0, "reward/mean": 0.5}\n')
        polled = c.get("/api/metrics", params={"run": ".", "since": first["next"]}).json()
        assert polled["records"] == [{"kind": "train", "step": 2, "time": 1.0, "reward/mean": 0.5}]
        assert (polled["next"], polled["partial_lines"]) == (2, 0)


def test_links_out_of_the_run_and_non_finite_metrics(runs_root: Path, tmp_path: Path) -> None:
    """A run's log.txt / config.yaml / episodes file linked to a file outside the run is not served (it reads as
    missing); a metric of NaN or 1e309 arrives as null in strict JSON, so the run's curves still load."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=hunter2\n")
    run = tmp_path / "runs" / "linked"
    shutil.copytree(runs_root / "synthetic" / "hand", run)
    for name in ("log.txt", "config.yaml"):
        (run / name).unlink()
        (run / name).symlink_to(secret)
    (run / "episodes" / "step_9.jsonl").symlink_to(secret)
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "time": 1.0, "reward/mean": NaN}\n'
                                       '{"kind": "train", "step": 2, "time": 2.0, "reward/mean": 1e309}\n')
    with start_view_server(tmp_path / "runs") as s, httpx.Client(base_url=s.url) as c:
        for route in ("/api/log", "/api/config", "/api/files", "/api/metrics"):
            resp = c.get(route, params={"run": "linked"})
            assert "hunter2" not in resp.text, route
        assert c.get("/api/log", params={"run": "linked"}).json()["lines"] == []
        assert "step_9" not in c.get("/api/files", params={"run": "linked"}).text
        resp = c.get("/api/metrics", params={"run": "linked"})
        assert "NaN" not in resp.text and "Infinity" not in resp.text
        records = json.loads(resp.text)["records"]
        assert [r["reward/mean"] for r in records] == [None, None]


def test_config_and_log(client: httpx.Client, runs_root: Path) -> None:
    body = _get(client, "/api/config", run="train")
    assert body["config"]["model"] == "tiny-random" and body["config"]["batch_size"] == 2
    assert body["text"] == (runs_root / "train" / "config.yaml").read_text()
    assert _get(client, "/api/config", run="eval")["config"]["benchmark"] == "arithmetic"
    assert _get(client, "/api/log", run="synthetic/hand", lines=5)["lines"] == [f"line {i}" for i in range(25, 30)]
    train_log = _get(client, "/api/log", run="train")["lines"]
    assert train_log and len(train_log) <= 200
    _get(client, "/api/log", 400, run="train", lines=0)


def test_files_of_train_and_eval(client: httpx.Client, runs_root: Path) -> None:
    files = {f["name"]: f for f in _get(client, "/api/files", run="train")["files"]}
    assert {"step_1", "step_2"} <= set(files)
    assert files["step_1"] == {**files["step_1"], "kind": "train", "step": 1, "episodes": 4}
    assert any(f["kind"] == "eval" and f["step"] == 2 for f in files.values())
    (ev,) = _get(client, "/api/files", run="eval")["files"]
    assert ev["name"] == "eval" and ev["episodes"] == 3


def test_episodes_paging_and_limits(client: httpx.Client, runs_root: Path) -> None:
    written = _episodes(runs_root / "train" / "episodes" / "step_1.jsonl")
    page = _get(client, "/api/episodes", run="train", file="step_1", offset=1, limit=2)
    assert page["total"] == 4 and page["offset"] == 1 and page["limit"] == 2
    assert [i["index"] for i in page["items"]] == [1, 2]
    for item in page["items"]:
        ep = written[item["index"]]
        assert item["task_id"] == ep["task"]["id"] and item["reward"] == ep["reward"]
        assert item["reason"] == ep["reward_reason"] and item["n_steps"] == 1 and item["n_trajectories"] == 1
        assert item["response_tokens"] == len(ep["trajectories"][0]["steps"][0]["completion_token_ids"])
    assert len(_get(client, "/api/episodes", run="train", file="step_1")["items"]) == 4  # default limit 50
    assert _get(client, "/api/episodes", run="train", file="step_1", offset=10)["items"] == []
    assert len(_get(client, "/api/episodes", run="train", file="step_1", limit=MAX_LIMIT)["items"]) == 4
    for bad in ({"limit": 0}, {"limit": MAX_LIMIT + 1}, {"offset": -1}, {"limit": "many"}, {"reward": "some"}):
        assert "error" in _get(client, "/api/episodes", 400, run="train", file="step_1", **bad)
    assert "step_1" in _get(client, "/api/episodes", 404, run="train", file="step_99")["error"]


def test_episodes_search_and_filters(client: httpx.Client) -> None:
    items = _get(client, "/api/episodes", run="synthetic/hand", file="step_1")["items"]
    assert [i["reward"] for i in items] == [1.0, 0.0, 0.0, 0.0, 0.0]
    zero = _get(client, "/api/episodes", run="synthetic/hand", file="step_1", reward="zero")
    assert zero["total"] == 4 and [i["index"] for i in zero["items"]] == [1, 2, 3, 4]
    assert _get(client, "/api/episodes", run="synthetic/hand", file="step_1", reward="nonzero")["total"] == 1
    assert [i["index"] for i in _get(client, "/api/episodes", run="synthetic/hand", file="step_1",
                                     reason="empty_token_ids")["items"]] == [4]
    assert _get(client, "/api/episodes", run="synthetic/hand", file="step_1", reason="wrong_answer")["total"] == 3
    hit = _get(client, "/api/episodes", run="synthetic/hand", file="step_1", q="ANSWER 3")
    assert [i["index"] for i in hit["items"]] == [3]  # case-insensitive, over the preview (the completion)
    paged = _get(client, "/api/episodes", run="synthetic/hand", file="step_1", q="answer", offset=3, limit=1)
    assert paged["total"] == 5 and [i["index"] for i in paged["items"]] == [3]


def test_episode_with_tokens_from_the_runs_tokenizer(client: httpx.Client, runs_root: Path) -> None:
    from rllm_serve.models import load_tokenizer

    written = _episodes(runs_root / "train" / "episodes" / "step_2.jsonl")[1]
    body = _get(client, "/api/episode", run="train", file="step_2", index=1)
    assert body["index"] == 1 and body["task_id"] == written["task"]["id"] and body["reward"] == written["reward"]
    assert body["reason"] == written["reward_reason"] and body["task"]["id"] == written["task"]["id"]
    (traj,) = body["trajectories"]
    (step,) = traj["steps"]
    src = written["trajectories"][0]["steps"][0]
    assert step["completion"] == src["text"] and step["messages"][0]["role"] in ("system", "user")
    assert [t["id"] for t in step["tokens"]] == src["completion_token_ids"]
    assert [t["logprob"] for t in step["tokens"]] == src["logprobs"]
    tok = load_tokenizer("tiny-random")
    assert [t["text"] for t in step["tokens"]] == [tok.decode([i]) for i in src["completion_token_ids"]]
    ev = _get(client, "/api/episode", run="eval", file="eval", index=0)
    assert ev["trajectories"][0]["steps"][0]["tokens"][0]["text"] is not None  # the eval config's model
    assert "4 episodes" in _get(client, "/api/episode", 404, run="train", file="step_2", index=4)["error"]
    _get(client, "/api/episode", 400, run="train", file="step_2")


def test_episode_long_text_is_cut_and_marked(client: httpx.Client) -> None:
    body = _get(client, "/api/episode", run="synthetic/hand", file="step_1", index=2)
    msg = body["trajectories"][0]["steps"][0]["messages"][0]
    assert len(msg["content"]) == MAX_TEXT and msg["truncated"] is True
    assert len(body["task"]["instruction"]) == MAX_TEXT
    short = _get(client, "/api/episode", run="synthetic/hand", file="step_1", index=0)
    assert short["trajectories"][0]["steps"][0]["messages"][0]["truncated"] is False
    crashed = _get(client, "/api/episode", run="synthetic/hand", file="step_1", index=3)
    assert crashed["error"] == "agent crashed: boom" and crashed["trajectories"][0]["steps"][0]["tokens"] == []


def test_groups(client: httpx.Client, runs_root: Path) -> None:
    written = _episodes(runs_root / "train" / "episodes" / "step_1.jsonl")
    groups = _get(client, "/api/groups", run="train", file="step_1")["groups"]
    assert len(groups) == 2 and sorted(i for g in groups for i in g["indices"]) == [0, 1, 2, 3]
    for g in groups:
        assert len(g["indices"]) == 2 and all(written[i]["task"]["id"] == g["task_id"] for i in g["indices"])
        assert g["rewards"] == [written[i]["reward"] for i in g["indices"]]
        assert g["all_zero"] == all(is_zero(r) for r in g["rewards"])
    hand = {g["task_id"]: g for g in _get(client, "/api/groups", run="synthetic/hand", file="step_1")["groups"]}
    assert not hand["t1"]["all_zero"] and hand["t2"]["all_zero"] and not hand["t1"]["all_one"]


def test_diagnosis_counts_match_the_episodes(client: httpx.Client, runs_root: Path) -> None:
    body = _get(client, "/api/diagnosis", run="train")
    by_file = {s["file"]: s for s in body["steps"]}
    for name in ("step_1", "step_2"):
        eps = _episodes(runs_root / "train" / "episodes" / f"{name}.jsonl")
        row = by_file[name]
        zeros = [e for e in eps if is_zero(e["reward"])]
        assert row["kind"] == "train" and row["episodes"] == len(eps) and row["zero_reward"] == len(zeros)
        assert sum(row["reasons"].values()) == len(zeros) and set(row["reasons"]) <= set(body["reasons"])
        expected: dict[str, int] = {}
        for e in zeros:  # the local backend records token ids and no errors: the grader's reason counts
            expected[e["reward_reason"]] = expected.get(e["reward_reason"], 0) + 1
        assert row["reasons"] == expected
        for reason, idx in row["examples"].items():
            assert 1 <= len(idx) <= 3 and all(eps[i]["reward_reason"] == reason for i in idx)
        assert row["groups"] == 2 and row["all_zero_groups"] + row["all_one_groups"] <= 2
    (hand,) = _get(client, "/api/diagnosis", run="synthetic/hand")["steps"]
    assert hand["reasons"] == {"wrong_answer": 2, "error": 1, "empty_token_ids": 1} and hand["zero_reward"] == 4
    assert hand["examples"] == {"wrong_answer": [1, 2], "error": [3], "empty_token_ids": [4]}
    assert (hand["groups"], hand["all_zero_groups"], hand["all_one_groups"]) == (3, 2, 0)
    for reason, count in hand["reasons"].items():  # each diagnosis cell links to exactly the episodes it counts
        listed = _get(client, "/api/episodes", run="synthetic/hand", file=hand["file"], reward="zero", reason=reason)
        assert listed["total"] == count, reason
    (ev,) = _get(client, "/api/diagnosis", run="eval")["steps"]
    assert ev["file"] == "eval" and ev["episodes"] == 3


def test_bad_run_parameters(client: httpx.Client) -> None:
    assert "run=" in _get(client, "/api/files", 400)["error"]
    assert "no run" in _get(client, "/api/files", 404, run="nope")["error"]
    assert "outside" in _get(client, "/api/files", 404, run="../..")["error"]
    assert "no run" in _get(client, "/api/files", 404, run="synthetic")["error"]  # a folder of runs, not a run


def test_page_and_static_files(client: httpx.Client) -> None:
    page = client.get("/")
    assert (page.status_code == 200 and "<html" in page.text.lower()) or "<!doctype" in page.text.lower()
    assert client.get("/static/../server.py").status_code == 404
    assert client.get("/static/no-such-file.js").status_code == 404


def test_token_auth(runs_root: Path) -> None:
    with start_view_server(runs_root, token="s3cret") as s, httpx.Client(base_url=s.url) as c:
        assert s.page_url.endswith("/?token=s3cret")
        denied = c.get("/api/runs")
        assert denied.status_code == 401 and "--token" in denied.json()["error"]
        assert c.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/api/files", params={"run": "train", "token": "s3cret"}).status_code == 200
        assert c.get("/", params={"token": "wrong"}).status_code == 401
        assert c.get("/", params={"token": "s3cret"}).status_code == 200  # sets the page's cookie
        assert c.get("/api/runs").status_code == 200  # the cookie alone now


def test_a_non_local_host_needs_a_token(runs_root: Path) -> None:
    with pytest.raises(ConfigError, match=r"--host 0.0.0.0 .*--token"):
        start_view_server(runs_root, host="0.0.0.0")
    res = CliRunner().invoke(build_app(), ["view", str(runs_root), "--host", "0.0.0.0", "--no-open"])
    assert res.exit_code == 1 and "--token" in res.output


def test_port_in_use_is_explained(runs_root: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"port {port} on 127.0.0.1 is already in use.*--port 0"):
            start_view_server(runs_root, port=port)


def test_not_a_run_is_explained(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"not a run and holds no run below it.*run.json"):
        start_view_server(tmp_path / "empty")
    with pytest.raises(ConfigError, match=r"is not a folder"):
        start_view_server(tmp_path / "missing")
    res = CliRunner().invoke(build_app(), ["view", str(tmp_path / "empty"), "--no-open"])
    assert res.exit_code == 1 and "not a run" in res.output


def test_rllm_view_command_serves_until_stopped(runs_root: Path) -> None:
    """The real command in its own process: prints the URL, answers, stops on SIGINT."""
    proc = subprocess.Popen([sys.executable, "-m", "rllm", "view", str(runs_root / "train"), "--port", "0",
                             "--no-open"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "300", "PYTHONFAULTHANDLER": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        runs = httpx.get(url.group(0) + "api/runs", timeout=30).json()["runs"]
        assert [r["id"] for r in runs] == ["."] and runs[0]["kind"] == "train"
    finally:
        proc.send_signal(2)
        try:
            proc.wait(60)  # a loaded full-suite CI run once took over 20 s to see it exit
        except subprocess.TimeoutExpired:  # say where it hangs: faulthandler dumps every thread on SIGABRT
            proc.send_signal(signal.SIGABRT)
            rest = proc.communicate(timeout=30)[0]
            pytest.fail(f"rllm view did not exit within 60 s of SIGINT; its output and threads:\n{rest[-8000:]}")
    assert proc.returncode == 0


def test_a_copied_run_is_a_fresh_root(runs_root: Path, tmp_path: Path) -> None:
    """A run directory moved elsewhere is viewed as is (nothing in it names its old place)."""
    shutil.copytree(runs_root / "eval", tmp_path / "moved")
    with start_view_server(tmp_path / "moved") as s, httpx.Client(base_url=s.url) as c:
        (run,) = c.get("/api/runs").json()["runs"]
        assert run["id"] == "." and c.get("/api/files", params={"run": "."}).json()["files"][0]["episodes"] == 3


def test_without_a_token_only_loopback_host_names_are_answered(runs_root: Path) -> None:
    """DNS rebinding: a page on evil.example rebound to 127.0.0.1 sends `Host: evil.example`; it gets nothing."""
    with start_view_server(runs_root) as server:
        assert httpx.get(f"{server.url}/api/runs", headers={"Host": "evil.example:80"}).status_code == 403
        assert httpx.get(f"{server.url}/api/runs", headers={"Host": "localhost"}).status_code == 200
        assert httpx.get(f"{server.url}/api/runs").status_code == 200
