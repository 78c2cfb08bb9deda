"""`rllm eval` as a function: options in, episodes.jsonl + summary.json out, an EvalSummary back.

Everything that can be wrong with the input is checked before the first episode: the benchmark name, its
data, the agent or workflow, the endpoint. Then the engine runs the episodes (a crash or timeout becomes
an episode with that reason) and each finished episode is appended to episodes.jsonl as it completes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rllm_core.benchmarks.registry import get_benchmark
from rllm_core.engine import run_episodes
from rllm_core.errors import ConfigError
from rllm_core.eval.agent import load_agent
from rllm_core.eval.endpoint import open_endpoint
from rllm_core.eval.summary import EvalSummary, summarize
from rllm_core.io import append_jsonl
from rllm_core.rollout import Rollout
from rllm_core.types import Episode

__all__ = ["EvalOptions", "EvalResult", "run_eval"]


class EvalOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmark: str
    split: str = "test"
    max_examples: int | None = None
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    attempts: int = 1
    concurrency: int = 16
    agent: str | None = None
    workflow: str | None = None
    output: Path | None = None
    data_dir: Path | None = None
    max_tokens: int = 512
    temperature: float | None = None
    """None: greedy (0.0) for one attempt, 1.0 when sampling several (pass@k needs diverse attempts)."""
    timeout_s: float | None = None
    seed: int = 0
    progress: bool = True


class EvalResult(BaseModel):
    summary: EvalSummary
    output_dir: Path
    episodes_path: Path
    summary_path: Path


def _rollout(opts: EvalOptions, default: Rollout) -> Rollout:
    if opts.agent and opts.workflow:
        raise ConfigError("give either --agent or --workflow, not both")
    if opts.agent:
        return load_agent(opts.agent)
    if opts.workflow:
        from rllm_core.workflows import get_workflow

        return get_workflow(opts.workflow)
    return default


def _output_dir(opts: EvalOptions) -> Path:
    out = opts.output or Path("rllm-runs") / f"eval-{opts.benchmark}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _check_numbers(opts: EvalOptions) -> None:
    if opts.attempts < 1 or opts.concurrency < 1:
        raise ConfigError(f"--attempts and --concurrency must be at least 1 (got {opts.attempts}, {opts.concurrency})")
    if opts.max_examples is not None and opts.max_examples < 1:
        raise ConfigError(f"--max-examples must be at least 1 (got {opts.max_examples}); omit it for every row")
    if opts.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1 (got {opts.max_tokens})")
    if opts.temperature is not None and opts.temperature < 0:
        raise ConfigError(f"--temperature must be 0 or more (got {opts.temperature}); 0 is greedy")
    if opts.timeout_s is not None and opts.timeout_s <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds (got {opts.timeout_s})")


def run_eval(opts: EvalOptions) -> EvalResult:
    """Check every input, open the endpoint, run the episodes, write episodes.jsonl and summary.json."""
    _check_numbers(opts)
    bench = get_benchmark(opts.benchmark)
    tasks = bench.load(split=opts.split, data_dir=str(opts.data_dir) if opts.data_dir else None,
                       max_examples=opts.max_examples, seed=opts.seed)
    if not tasks:
        raise ConfigError(f"benchmark {bench.name!r} split {opts.split!r} has no rows to evaluate")
    rollout = _rollout(opts, bench.default_rollout())
    temperature = opts.temperature if opts.temperature is not None else (0.0 if opts.attempts == 1 else 1.0)
    sampling: dict[str, Any] = {"temperature": temperature, "max_tokens": opts.max_tokens}
    with open_endpoint(opts.base_url, opts.model, opts.api_key) as endpoint:
        out = _output_dir(opts)
        episodes_path, summary_path = out / "episodes.jsonl", out / "summary.json"
        episodes_path.write_text("")

        def save(ep: Episode) -> None:
            append_jsonl(episodes_path, ep)

        started = time.monotonic()
        try:
            episodes = asyncio.run(run_episodes(
                rollout, tasks, base_url=endpoint.base_url, model=endpoint.model, api_key=endpoint.api_key,
                attempts=opts.attempts, concurrency=opts.concurrency, sampling=sampling, benchmark=bench,
                timeout_s=opts.timeout_s, progress=opts.progress, on_episode=save,
                description=f"{bench.name} · {endpoint.model}",
            ))
        except KeyboardInterrupt:
            done = sum(1 for line in episodes_path.read_text(encoding="utf-8").splitlines() if line.strip())
            raise KeyboardInterrupt(f"interrupted: {done} of {len(tasks) * opts.attempts} episodes finished, "
                                    f"saved in {episodes_path} (no summary.json)") from None
        wall = time.monotonic() - started
    config = opts.model_dump(mode="json", exclude={"api_key"})
    config.update(temperature=temperature, rollout=rollout.name, endpoint_source=endpoint.source)
    summary = summarize(episodes, benchmark=bench.name, split=opts.split, model=endpoint.model,
                        attempts=opts.attempts, wall_time_s=wall, base_url=endpoint.base_url, config=config)
    summary_path.write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return EvalResult(summary=summary, output_dir=out, episodes_path=episodes_path, summary_path=summary_path)
