"""`rllm eval` as a function: options in, episodes.jsonl + summary.json out, an EvalSummary back.

Everything that can be wrong with the input is checked before the first episode: the benchmark name, its
data, the agent or workflow, the endpoint. The benchmark's `eval_defaults` (e.g. FrozenLake's small per-turn
max_tokens) fill the options the caller left unset (`apply_eval_defaults`; said in one line, and saved in
config.yaml and summary.json as `benchmark_defaults`). Then the engine runs the episodes (a crash or timeout becomes
an episode with that reason) and each finished episode is appended to episodes.jsonl as it completes.

The rollout executor (rllm_rollout.executor) runs them: in this process, or with `rollout_workers > 0` in that
many Ray actors on a local cluster started for the run, or on `ray_address`; the in-process gateway in front
of the endpoint records them, and summary.json's config["ray"] says how many workers died and what that cost
(retried / lost).

The output is a run directory of `rllm_core.runs` (kind "eval"; docs/run-directory.md), so `rllm view` follows an
eval as it runs: run.json, config.yaml (these options), heartbeat.json, log.txt, episodes.jsonl with its index
sidecar episodes.jsonl.idx (the reader's file "eval"), and at the end summary.json and one `eval` record of its
figures in metrics.jsonl.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from rich.console import Console

from rllm_core.errors import ConfigError
from rllm_core.runs.episodes import EpisodeWriter
from rllm_core.runs.writer import RunWriter
from rllm_core.types import Episode
from rllm_envs.eval.endpoint import open_endpoint
from rllm_envs.eval.summary import EvalSummary, summarize
from rllm_envs.rewards.reward_mix import with_reward
from rllm_rollout.agent_loader import load_agent
from rllm_rollout.benchmarks.base import recommended_unset
from rllm_rollout.benchmarks.registry import get_benchmark
from rllm_rollout.executor import EpisodeBatch, RayExecutor, open_executor
from rllm_rollout.rollout import Rollout

__all__ = ["EvalOptions", "EvalResult", "apply_eval_defaults", "run_eval"]

log = logging.getLogger("rllm.eval")


class EvalOptions(BaseModel):
    """What `rllm eval` runs. A field left unset (not passed) may be filled by the benchmark's `eval_defaults`;
    one passed explicitly, even with its default value, is kept."""

    model_config = ConfigDict(extra="forbid")

    benchmark: str
    split: str = "test"
    max_examples: int | None = None
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    sandbox: str | None = None
    """Sandbox provider for sandboxed benchmarks (local, docker, modal, daytona); None: the benchmark's default."""
    backend: str | None = None
    """Sample through a training backend's own serving (e.g. 'tinker': --model is a base model or a run dir)."""
    attempts: int = 1
    concurrency: int = 16
    agent: str | None = None
    harness: str | None = None
    """A CLI agent run unchanged in each task's sandbox (`rllm plugins` lists them): claude-code, codex, ..."""
    workflow: str | None = None
    output: Path | None = None
    data_dir: Path | None = None
    max_tokens: int = 512
    """Completion tokens per LLM call (per turn of a multi-turn agent)."""
    max_turns: int | None = None
    """Turns per episode of multi-turn agents, which read it from `task.metadata["max_turns"]` (frozenlake,
    terminal); None: the benchmark's own limit."""
    temperature: float | None = None
    """None: greedy (0.0) for one attempt, 1.0 when sampling several (pass@k needs diverse attempts)."""
    timeout_s: float | None = None
    seed: int = 0
    progress: bool = True
    rollout_workers: int = 0
    """Ray workers to run the episodes in; 0 runs them in this process."""
    ray_address: str | None = None
    """The Ray cluster for rollout_workers ('auto', 'host:port', 'ray://host:port'); None: a local one."""
    gateway: str | None = None
    """An `rllm gateway` started elsewhere (its URL, e.g. http://198.18.0.4:8080) that records every call instead
    of one started here; its token from $RLLM_GATEWAY_API_KEY. The model is its --upstream."""
    reward: str | None = None
    """The reward mixed from parts by weights ('em:0.7,judge:0.3') or a preset's name; None: the benchmark's."""
    judge: str | None = None
    """The judge model of a `judge` part: 'MODEL@URL' or 'URL'; None: the model of `rllm model setup`."""
    rubric: str | None = None
    """The judge's rubric: a built-in name (answer_and_reasoning, answer_correct) or a file."""


class EvalResult(BaseModel):
    summary: EvalSummary
    output_dir: Path
    episodes_path: Path
    summary_path: Path


def _rollout(opts: EvalOptions, bench: Any) -> Rollout:
    if sum(bool(x) for x in (opts.agent, opts.workflow, opts.harness)) > 1:
        raise ConfigError("give one of --agent, --workflow and --harness, not several")
    if opts.harness:
        from rllm_harnesses.rollout import harness_rollout

        rollout = harness_rollout(opts.harness)
    elif opts.agent:
        named = bench.named_agent(opts.agent) if ":" not in opts.agent else None
        rollout = named or load_agent(opts.agent)
    elif opts.workflow:
        from rllm_envs.workflows import get_workflow

        rollout = get_workflow(opts.workflow)
    else:
        rollout = bench.default_rollout()
    return bench.wrap_rollout(rollout, sandbox=opts.sandbox)


def _output_dir(opts: EvalOptions) -> Path:
    out = opts.output or Path("runs") / f"eval-{opts.benchmark}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def apply_eval_defaults(opts: EvalOptions, benchmark: Any) -> tuple[EvalOptions, dict[str, Any]]:
    """The options with the benchmark's recommendations (`benchmark.eval_defaults`, EvalOptions names) for every
    option the caller did not set, and what was applied. Precedence: EvalOptions defaults < benchmark < what the
    caller passed (a flag). Unknown names are warned about and ignored; a bad value is a ConfigError."""
    applied = recommended_unset(getattr(benchmark, "eval_defaults", None) or {}, EvalOptions.model_fields,
                                opts.model_fields_set, opts.benchmark, "eval")
    if not applied:
        return opts, {}
    try:
        return EvalOptions.model_validate({**opts.model_dump(exclude_unset=True), **applied}), applied
    except ValidationError as exc:
        raise ConfigError(f"benchmark {opts.benchmark!r} recommends bad eval options {applied}: "
                          f"{exc.errors()[0].get('msg')}; pass the option yourself") from None


def _check_numbers(opts: EvalOptions) -> None:
    if opts.attempts < 1 or opts.concurrency < 1:
        raise ConfigError(f"--attempts and --concurrency must be at least 1 (got {opts.attempts}, {opts.concurrency})")
    if opts.max_examples is not None and opts.max_examples < 1:
        raise ConfigError(f"--max-examples must be at least 1 (got {opts.max_examples}); omit it for every row")
    if opts.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1 (got {opts.max_tokens})")
    if opts.max_turns is not None and opts.max_turns < 1:
        raise ConfigError(f"--max-turns must be at least 1 (got {opts.max_turns}); omit it for the benchmark's")
    if opts.temperature is not None and opts.temperature < 0:
        raise ConfigError(f"--temperature must be 0 or more (got {opts.temperature}); 0 is greedy")
    if opts.timeout_s is not None and opts.timeout_s <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds (got {opts.timeout_s})")
    if opts.rollout_workers < 0:
        raise ConfigError(f"--rollout-workers must be 0 or more (got {opts.rollout_workers}); 0 runs the "
                          "episodes in this process")
    if opts.gateway is not None and (opts.base_url or opts.backend):
        raise ConfigError(f"--gateway {opts.gateway} sends every call to the gateway's own --upstream: drop "
                          f"{'--base-url' if opts.base_url else '--backend'}")
    if opts.ray_address is not None and opts.rollout_workers == 0:
        raise ConfigError(f"--ray-address {opts.ray_address} needs --rollout-workers N (how many Ray workers "
                          "run the episodes); without it the episodes run in this process and Ray is not used")


def run_eval(opts: EvalOptions, console: Console | None = None) -> EvalResult:
    """Check every input, open the endpoint, run the episodes, write episodes.jsonl and summary.json.

    The benchmark's `eval_defaults` fill the options `opts` left unset; the line saying so goes to `console`
    (default: stdout; `Console(quiet=True)` for none)."""
    _check_numbers(opts)
    if opts.ray_address is not None:  # a wrong address fails in seconds, before data or endpoint are touched
        from rllm_rollout.distributed import check_ray_address

        check_ray_address(opts.ray_address)
    bench = with_reward(get_benchmark(opts.benchmark), opts.reward, opts.judge, opts.rubric)
    opts, recommended = apply_eval_defaults(opts, bench)
    if recommended:
        _check_numbers(opts)
        shown = ", ".join(f"{k}={v}" for k, v in recommended.items())
        (console or Console()).print(f"[dim]{bench.name}'s recommended eval settings: {shown} (a flag overrides "
                                     "them)[/dim]", soft_wrap=True, highlight=False)
    tasks = bench.load(split=opts.split, data_dir=str(opts.data_dir) if opts.data_dir else None,
                       max_examples=opts.max_examples, seed=opts.seed)
    if not tasks:
        raise ConfigError(f"benchmark {bench.name!r} split {opts.split!r} has no rows to evaluate")
    if opts.max_turns is not None:  # in the task, so it travels with it (Ray workers) and shows in episodes.jsonl
        for task in tasks:
            task.metadata["max_turns"] = opts.max_turns
    rollout = _rollout(opts, bench)
    temperature = opts.temperature if opts.temperature is not None else (0.0 if opts.attempts == 1 else 1.0)
    sampling: dict[str, Any] = {"temperature": temperature, "max_tokens": opts.max_tokens}
    config = opts.model_dump(mode="json", exclude={"api_key"})
    if recommended:
        config["benchmark_defaults"] = dict(recommended)
    remote = _remote_gateway(opts.gateway)
    base_url, api_key = (f"{remote.url}/v1", remote.client_api_key) if remote else (opts.base_url, opts.api_key)
    with open_endpoint(base_url, opts.model, api_key, backend=opts.backend) as endpoint:
        out = _output_dir(opts)
        episodes_path, summary_path = out / "episodes.jsonl", out / "summary.json"
        config.update(temperature=temperature, rollout=rollout.name, endpoint_source=endpoint.source)
        run = RunWriter(out, "eval").start(max_steps=len(tasks) * opts.attempts)
        (out / "config.yaml").write_text(yaml.safe_dump({**config, "served_model": endpoint.model},
                                                        sort_keys=False), encoding="utf-8")
        writer = EpisodeWriter(episodes_path)

        def save(ep: Episode) -> None:
            writer.write(ep)
            run.set_step(writer.count)

        started = time.monotonic()
        ray_stats: dict[str, Any] | None = None
        failure: str | None = "interrupted"
        try:
            batch = EpisodeBatch(rollout, tasks, model=endpoint.model, base_url=endpoint.base_url, gateway=remote,
                                 api_key=endpoint.api_key, attempts=opts.attempts, concurrency=opts.concurrency,
                                 sampling=sampling, benchmark=bench, timeout_s=opts.timeout_s,
                                 progress=opts.progress, on_episode=save,
                                 description=f"{bench.name} · {endpoint.model}")
            with open_executor(opts.rollout_workers, opts.ray_address) as executor:
                episodes = asyncio.run(executor.run(batch))
                if isinstance(executor, RayExecutor):
                    ray_stats = {"address": executor.connection.address, **executor.last}
            wall = time.monotonic() - started
            if ray_stats is not None:
                config["ray"] = ray_stats
            summary = summarize(episodes, benchmark=bench.name, split=opts.split, model=endpoint.model,
                                attempts=opts.attempts, wall_time_s=wall, base_url=endpoint.base_url,
                                config=config)
            summary_path.write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
            run.log("eval", 0, _summary_record(summary))
            failure = None
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"interrupted: {writer.count} of {len(tasks) * opts.attempts} episodes "
                                    f"finished, saved in {episodes_path} (no summary.json)") from None
        except BaseException as exc:
            failure = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            writer.close()
            run.stop(failure)
    return EvalResult(summary=summary, output_dir=out, episodes_path=episodes_path, summary_path=summary_path)


def _remote_gateway(url: str | None) -> Any:
    """The `--gateway` client (token from $RLLM_GATEWAY_API_KEY, as `rllm gateway` reads it), or None."""
    if url is None:
        return None
    from rllm_rollout.gateway import RemoteGateway

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--gateway {url!r} must be the gateway's URL, like http://HOST:8080")
    token = os.environ.get("RLLM_GATEWAY_API_KEY")
    if not token:
        raise ConfigError(f"--gateway {url}: set RLLM_GATEWAY_API_KEY to that gateway's token (its --api-key), "
                          "which reading and taking its sessions needs")
    return RemoteGateway(url.rstrip("/").removesuffix("/v1"), api_key=token)


def _summary_record(summary: EvalSummary) -> dict[str, Any]:
    """The summary's figures as one metrics.jsonl `eval` record, under the names train records use."""
    n = summary.n_episodes or 1
    return {"reward/mean": summary.mean_reward, "reward/accuracy": summary.accuracy, **summary.pass_at_k,
            "episode/count": summary.n_episodes, "episode/tasks": summary.n_tasks, "episode/errors": summary.errors,
            "episode/context_exceeded": summary.context_exceeded,
            "episode/response_tokens_mean": summary.completion_tokens / n,
            **{f"reason/{r}": c / n for r, c in summary.reasons.items()},
            "tokens/prompt": summary.prompt_tokens, "tokens/completion": summary.completion_tokens,
            "throughput/tokens_per_s": summary.tokens_per_s, "time/eval_s": summary.wall_time_s}
