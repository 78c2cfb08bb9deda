"""The `rllm view` page in a real headless Chromium (Playwright driving the system browser): the runs list, a run's
reward chart with one point per step, a point appearing while a run writes, an episode's tokens coloured by
logprob, the episode filters, the zero-reward breakdown with the counts computed here from the episodes files,
and compare mode. Run directories come from a real 2-step `tiny-random` training run and a real eval against the
local policy server, plus one hand-written run with mixed reasons. A screenshot lands in the test's tmp dir and
is copied to /tmp/rllm-view-screenshot.png.

Needs the `chromium` Debian package (/usr/bin/chromium) and `playwright` (the dev extra); Playwright's own browser
download is not used."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rllm_monitor.server import ViewServer, start_view_server

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.slow,  # one training run, one eval and a browser for the module (~50 s)
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing: install the browser with `sudo apt-get "
                       "install -y chromium chromium-driver` (.ci/run does this) to run the page's browser test"),
]
LAUNCH_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync"]
SCREENSHOT_COPY = Path("/tmp/rllm-view-screenshot.png")
WAIT_MS = 20_000


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _episode_files(run: Path) -> dict[str, list[dict[str, Any]]]:
    files = sorted(p for p in (run / "episodes").glob("*.jsonl") if not p.name.endswith(".idx.jsonl"))
    return {p.name.removesuffix(".jsonl"): _jsonl(p) for p in files}


def _expected_reason(ep: dict[str, Any]) -> str:
    """Why a zero-reward episode earned nothing, by the rule the page documents (rllm_monitor/diagnosis.py):
    a recorded timeout/error, then an error message, then no token ids at all, then the grader's reason."""
    reason = ep.get("reward_reason")
    if reason in ("timeout", "error"):
        return reason
    if ep.get("error"):
        return "error"
    steps = [s for t in ep.get("trajectories") or [] for s in t.get("steps") or []]
    if not any(s.get("completion_token_ids") for s in steps):
        return "empty_token_ids"
    return reason or "unknown"


def _zero_breakdown(episodes: list[dict[str, Any]]) -> Counter[str]:
    return Counter(_expected_reason(e) for e in episodes if e.get("reward") is None or e["reward"] <= 0)


def _write_mixed_run(run: Path) -> None:
    """A finished train run written by hand: one step of six episodes over three tasks with known outcomes."""
    (run / "episodes").mkdir(parents=True)
    now = time.time()
    (run / "run.json").write_text(json.dumps({"format": 1, "kind": "train", "started": now, "pid": 1,
                                              "host": "elsewhere", "argv": ["rllm", "train"]}))
    (run / "config.yaml").write_text("benchmark: arithmetic\nmodel: tiny-random\nbackend: local\nmax_steps: 1\n")
    (run / "heartbeat.json").write_text(json.dumps({"time": now, "status": "finished", "step": 1}))
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "time": now, "reward/mean": 2 / 6,
                                                   "reward/accuracy": 2 / 6}) + "\n"
                                       + json.dumps({"kind": "eval", "step": 1, "time": now,
                                                     "val/reward/accuracy": 1.0}) + "\n")

    def ep(task: str, reward: float, reason: str, ids: list[int] | None, error: str | None = None) -> dict[str, Any]:
        step = {"messages": [{"role": "user", "content": f"solve {task}"}], "text": f"answer to {task}",
                "completion_token_ids": ids, "logprobs": [-0.25] * len(ids) if ids else None,
                "prompt_token_ids": [1, 2] if ids else None, "token_source": "server" if ids else "none"}
        return {"task": {"id": task}, "reward": reward, "reward_reason": reason, "is_correct": reward > 0,
                "error": error, "trajectories": [{"name": "solver", "steps": [step]}]}

    eps = [ep("t1", 1.0, "correct", [5, 6]), ep("t1", 1.0, "correct", [7]),        # all-one group
           ep("t2", 0.0, "wrong_answer", [8]), ep("t2", 0.0, "wrong_answer", [9]),  # all-zero group
           ep("t3", 0.0, "format_error", [10], error="agent crashed: boom"),       # counted as error
           ep("t3", 0.0, "wrong_answer", None)]                                    # counted as empty_token_ids
    eps[2]["artifacts"] = {"tool_log": [  # a search agent's tool calls, as rllm_envs.tool_records writes them
        {"name": "search", "arguments": {"query": "Corliss Archer", "k": 3}, "result_chars": 512, "latency_s": 0.004,
         "error": None, "started_at": now, "transport": "mcp"},
        {"name": "open", "arguments": {"doc_id": "nope"}, "result_chars": 40, "latency_s": 0.001,
         "error": "Error: no passage 'nope'", "started_at": now, "transport": "mcp"}]}
    (run / "episodes" / "step_1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/train (rllm train: local backend, tiny-random, 2 steps, validation at step 2), root/live (a copy of
    it the live test writes to), root/eval (run_eval against the policy server), root/mixed (hand-written)."""
    from rllm_envs.eval.runner import EvalOptions, run_eval
    from rllm_serve import start_policy_server
    from rllm_train.config import load_config
    from rllm_train.loop import train

    root = tmp_path_factory.mktemp("runs")
    config = load_config(None, benchmark="arithmetic", model="tiny-random", batch_size=2, group_size=2,
                         max_tokens=8, max_steps=2, eval_every=2, eval_examples=2, seed=3, output=str(root / "train"))
    train(config, progress=False, console=Console(quiet=True))
    shutil.copytree(root / "train", root / "live", ignore=shutil.ignore_patterns("checkpoints"))
    with start_policy_server("tiny-random") as server:
        run_eval(EvalOptions(benchmark="arithmetic", base_url=server.base_url, model="tiny-random", max_examples=3,
                             max_tokens=8, output=root / "eval", progress=False))
    _write_mixed_run(root / "mixed")
    return root


@pytest.fixture(scope="module")
def server(runs_root: Path) -> Iterator[ViewServer]:
    with start_view_server(runs_root) as s:
        yield s


@pytest.fixture(scope="module")
def browser(server: ViewServer) -> Iterator[Any]:
    """After the runs are made: Playwright's sync API keeps an event loop running in this thread, and the
    training loop's asyncio.run cannot start inside it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """One browser tab on the view server; records the page's uncaught errors so each test can assert none."""

    def __init__(self, tab: Any, base: str) -> None:
        self.tab = tab
        self.base = base
        self.errors: list[str] = []
        tab.on("pageerror", lambda e: self.errors.append(str(e)))
        tab.set_default_timeout(WAIT_MS)

    def open(self, hash_: str, view: str) -> None:
        """Go to the page at `hash_` and wait until the router has drawn `view` (main#app's data-view)."""
        self.tab.goto(f"{self.base}/{hash_}")
        self.wait_view(view)

    def wait_view(self, view: str) -> None:
        self.tab.wait_for_selector(f'main#app[data-view="{view}"]')
        banner = self.tab.locator("#banner")
        assert banner.is_hidden(), f"the page shows an error: {banner.inner_text()}"

    def testid(self, tid: str) -> Any:
        return self.tab.locator(f'[data-testid="{tid}"]')


@pytest.fixture
def page(browser: Any, server: ViewServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    view = Page(context.new_page(), server.url)
    try:
        yield view
        assert not view.errors, f"uncaught errors in the page: {view.errors}"
    finally:
        context.close()


def test_runs_list_shows_each_run_with_its_status(page: Page, server: ViewServer) -> None:
    page.open("", "runs")
    rows = page.tab.locator('[data-testid="runs-table"] tbody tr[data-run-id]')
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.runId)")) == ["eval", "live", "mixed", "train"]
    train = page.tab.locator('tr[data-run-id="train"]')
    assert train.locator('[data-testid="status-badge"]').inner_text() == "finished"
    assert "2/2" in train.inner_text() and "tiny-random" in train.inner_text()
    assert page.tab.locator('tr[data-run-id="eval"] [data-testid="status-badge"]').inner_text() == "finished"
    cells = page.tab.locator('tr[data-run-id="mixed"] td.num').all_inner_texts()  # rates alike: 1.0 as 1.000
    assert cells[-3:] == ["0.333", "0.333", "1.000"], cells


def test_run_page_draws_one_reward_point_per_step(page: Page, runs_root: Path, tmp_path: Path) -> None:
    records = _jsonl(runs_root / "train" / "metrics.jsonl")
    train_points = sum(1 for r in records if r["kind"] == "train" and "reward/mean" in r)
    eval_points = sum(1 for r in records if r["kind"] == "eval" and "val/reward/mean" in r)
    assert train_points == 2 and eval_points >= 1
    page.open("", "runs")
    page.tab.locator('tr[data-run-id="train"] [data-testid="run-link"]').click()  # a real click through
    page.wait_view("run-curves")
    chart = page.testid("reward-chart")
    assert chart.get_attribute("data-points") == str(train_points)
    assert chart.get_attribute("data-eval-points") == str(eval_points)
    assert chart.locator("canvas").count() == 1  # uPlot drew it
    for other in ("accuracy", "length", "kl", "clip", "entropy", "grad-norm", "throughput", "phases"):
        assert page.testid(f"{other}-chart").count() == 1, f"no {other} chart"
    page.tab.locator("#smoothing").fill("0.6")  # smoothing adds the raw series behind the smoothed one
    page.tab.wait_for_function("document.querySelector('[data-testid=reward-chart]').innerText.includes('(raw)')")
    page.testid("axis-toggle").click()  # seconds on the x axis: the same points
    assert "seconds" in page.testid("axis-toggle").inner_text()
    assert chart.get_attribute("data-points") == str(train_points)
    page.tab.locator("#smoothing").fill("0")
    page.testid("axis-toggle").click()
    shot = tmp_path / "rllm-view-run.png"
    page.tab.screenshot(path=str(shot), full_page=True)
    shutil.copyfile(shot, SCREENSHOT_COPY)
    print(f"screenshot: {shot} (copied to {SCREENSHOT_COPY})")


def test_a_point_appears_while_the_run_writes(page: Page, runs_root: Path) -> None:
    run = runs_root / "live"
    beat = run / "heartbeat.json"
    beat.write_text(json.dumps({"time": time.time(), "status": "running", "step": 2, "pid": os.getpid()}))
    page.open("#/run/live", "run-curves")
    chart = page.testid("reward-chart")
    assert chart.get_attribute("data-points") == "2"
    assert "live" in page.testid("live-indicator").inner_text()
    last = _jsonl(run / "metrics.jsonl")[-1]
    with (run / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "train", "step": 3, "time": last["time"] + 1, "reward/mean": 0.5,
                            "reward/accuracy": 0.5}) + "\n")
    beat.write_text(json.dumps({"time": time.time(), "status": "running", "step": 3, "pid": os.getpid()}))
    page.tab.wait_for_function("document.querySelector('[data-testid=reward-chart]').dataset.points === '3'",
                               timeout=15_000)  # polled every 2 s
    beat.write_text(json.dumps({"time": time.time(), "status": "finished", "step": 3}))


def test_episode_view_shows_tokens_coloured_by_logprob(page: Page, runs_root: Path, tmp_path: Path) -> None:
    episodes = _episode_files(runs_root / "train")["step_1"]
    page.open("#/run/train/file/step_1", "run-file")
    assert page.testid("episodes-table").get_attribute("data-total") == str(len(episodes))
    assert page.testid("episode-link").count() == len(episodes)
    page.testid("episode-link").first.click()
    page.wait_view("run-episode")
    step = episodes[0]["trajectories"][0]["steps"][0]
    tokens = page.testid("episode-tokens").first.locator("span.tok")
    assert tokens.count() == len(step["completion_token_ids"]) > 0
    first = tokens.first
    assert f"logprob {step['logprobs'][0]:.4f}" in first.get_attribute("title")
    assert first.get_attribute("style").startswith("background:") and "hsl(" in first.get_attribute("style")
    assert first.inner_text().strip() and not first.inner_text().startswith("⟨")  # decoded by the run's tokenizer
    assert page.testid("episode-reason").inner_text() == episodes[0]["reward_reason"]
    page.tab.screenshot(path=str(tmp_path / "rllm-view-episode.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'rllm-view-episode.png'}")


def test_episode_filters_and_groups(page: Page) -> None:
    page.open("#/run/mixed/file/step_1", "run-file")
    assert page.testid("episodes-table").get_attribute("data-total") == "6"
    page.testid("reward-filter").select_option("nonzero")
    page.tab.wait_for_selector('[data-testid="episodes-table"][data-total="2"]')
    page.testid("reward-filter").select_option("zero")
    page.tab.wait_for_selector('[data-testid="episodes-table"][data-total="4"]')
    page.testid("reason-filter").select_option("empty_token_ids")
    page.tab.wait_for_selector('[data-testid="episodes-table"][data-total="1"]')
    page.open("#/run/mixed/file/step_1?q=t3", "run-file")
    assert page.testid("episodes-table").get_attribute("data-total") == "2"
    page.testid("groups-link").click()
    page.wait_view("run-groups")
    assert page.tab.locator('[data-testid="groups-table"] tbody tr').count() == 3
    page.testid("side-by-side").nth(1).click()  # task t2: two attempts side by side
    page.wait_view("run-group")
    assert page.tab.locator('[data-testid="group-columns"] .column').count() == 2


def test_zero_reward_breakdown_shows_the_counts_of_the_files(page: Page, runs_root: Path, tmp_path: Path) -> None:
    for run in ("train", "mixed"):
        page.open(f"#/run/{run}", "run-curves")
        page.testid("tab-diagnosis").click()
        page.wait_view("run-diagnosis")
        for name, episodes in _episode_files(runs_root / run).items():
            expected = _zero_breakdown(episodes)
            zero = page.testid(f"diag-zero-{name}")
            assert zero.inner_text() == str(sum(expected.values())), name
            cells = page.tab.locator(f'[data-testid^="diag-cell-{name}-"]')
            prefix = f"diag-cell-{name}-"
            shown = {c.get_attribute("data-testid").removeprefix(prefix): int(c.get_attribute("data-count"))
                     for c in cells.all()}
            assert {r: n for r, n in shown.items() if n} == dict(expected), name
            by_task: dict[str, list[float | None]] = {}
            for e in episodes:
                by_task.setdefault(e["task"]["id"], []).append(e.get("reward"))
            all_zero = sum(all(r is None or r <= 0 for r in rs) for rs in by_task.values())
            assert page.testid(f"diag-allzero-{name}").inner_text() == str(all_zero), name
    # the hand-written run has one of each reason: check the literal figures too, then follow an example
    assert page.testid("diag-cell-step_1-wrong_answer").get_attribute("data-count") == "2"
    assert page.testid("diag-cell-step_1-error").get_attribute("data-count") == "1"
    assert page.testid("diag-cell-step_1-empty_token_ids").get_attribute("data-count") == "1"
    assert page.testid("diag-allone-step_1").inner_text() == "1"
    page.tab.screenshot(path=str(tmp_path / "rllm-view-diagnosis.png"), full_page=True)
    print(f"screenshot: {tmp_path / 'rllm-view-diagnosis.png'}")
    page.testid("diag-cell-step_1-error").locator('[data-testid="diag-example"]').first.click()
    page.wait_view("run-episode")
    assert page.testid("episode-reason").inner_text() == "format_error"
    assert "agent crashed" in page.testid("episode-head").inner_text()


def test_an_episodes_tool_calls_are_listed_with_result_size_latency_and_error(page: Page) -> None:
    page.open("#/run/mixed/episode/step_1/2", "run-episode")
    assert page.testid("tool-log").get_attribute("data-count") == "2"
    rows = page.testid("tool-call")
    assert rows.count() == 2
    first, second = rows.nth(0).inner_text(), rows.nth(1).inner_text()
    assert "search" in first and "Corliss Archer" in first and "512 chars" in first and "4.0 ms" in first
    assert "mcp" in first and "no passage 'nope'" in second


def test_compare_overlays_the_chosen_runs(page: Page) -> None:
    page.open("", "runs")
    page.tab.evaluate("sessionStorage.removeItem('rllm-compare')")
    page.open("", "runs")
    page.tab.locator('[data-testid="compare-pick"][data-run="train"]').check()
    page.tab.locator('[data-testid="compare-pick"][data-run="mixed"]').check()
    page.testid("compare-button").click()
    page.wait_view("compare")
    legend = page.testid("compare-reward-chart").inner_text()
    assert "train" in legend and "mixed" in legend
