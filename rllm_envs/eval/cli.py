"""`rllm eval BENCHMARK ...`: evaluate a model, your own rollout, or a workflow on a benchmark."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from rllm_core.errors import RLLMError

__all__ = ["eval_command"]


def eval_command(
    benchmark: str = typer.Argument(..., help="Benchmark name (`rllm bench list`)."),
    split: str = typer.Option("test", "--split", help="Split to evaluate."),
    max_examples: int | None = typer.Option(None, "--max-examples", "-n", help="Only the first N tasks."),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint ending in /v1."),
    model: str | None = typer.Option(None, "--model", help="Model name at the endpoint (or a built-in embedded one)."),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="Environment variable holding the API key."),
    sandbox: str | None = typer.Option(
        None, "--sandbox", help="Sandbox provider for agentic benchmarks: local (default), docker, modal, daytona.",
    ),
    backend: str | None = typer.Option(
        None, "--backend", help="Sample through a training backend (e.g. tinker; --model: base model or run dir).",
    ),
    attempts: int = typer.Option(1, "--attempts", "-k", help="Attempts per task (pass@k)."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", "-c", help="Episodes in flight at once (default 16, or the benchmark's).",
    ),
    agent: str | None = typer.Option(None, "--agent", help="Your @rllm.rollout as 'package.module:function'."),
    harness: str | None = typer.Option(
        None, "--harness", help="A CLI agent run unchanged in each task's sandbox: claude-code, codex, qwen-code, "
                                "mini-swe-agent (`rllm plugins`).",
    ),
    workflow: str | None = typer.Option(
        None, "--workflow",
        help="refinement | solver-judge | self-debate; options after a colon: 'solver-judge:n_solvers=3'.",
    ),
    output: Path | None = typer.Option(None, "--output", "-o",
                                       help="Output folder (default runs/eval-BENCH-TIME, beside rllm train's)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Benchmark files folder (default $RLLM_DATA_DIR)."),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help="Max completion tokens per LLM call (default 512, or the benchmark's).",
    ),
    max_turns: int | None = typer.Option(
        None, "--max-turns", help="Turns per episode of multi-turn benchmarks (default: the benchmark's).",
    ),
    temperature: float | None = typer.Option(None, "--temperature", help="Default 0 (1 with --attempts > 1)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds per episode before it is stopped."),
    seed: int = typer.Option(0, "--seed", help="Seed for generated benchmarks."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
    rollout_workers: int = typer.Option(
        0, "--rollout-workers", help="Run the episodes in N Ray worker processes (0: in this process).",
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address",
        help="Ray cluster for --rollout-workers: 'auto', 'host:port' or 'ray://host:port' (default: a local one).",
    ),
    gateway: str | None = typer.Option(
        None, "--gateway", help="Record through this `rllm gateway` (URL; token in $RLLM_GATEWAY_API_KEY).",
    ),
    reward: str | None = typer.Option(
        None, "--reward", help="Mix the reward: 'em:0.7,judge:0.3' (rule, a grader score, judge) or a preset.",
    ),
    judge: str | None = typer.Option(None, "--judge", help="Judge model 'MODEL@URL' (default: rllm model setup's)."),
    rubric: str | None = typer.Option(None, "--rubric", help="Judge rubric: answer_and_reasoning, answer_correct, "
                                                             "or a file."),
) -> None:
    """Evaluate on a benchmark; writes episodes.jsonl and summary.json, prints a short table."""
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            typer.secho(f"error: --api-key-env {api_key_env}: that environment variable is not set",
                        fg=typer.colors.RED, err=True)
            raise typer.Exit(2)
    from rllm_envs.eval.runner import EvalOptions, run_eval  # late: `rllm --help` / `rllm model` stay light
    from rllm_envs.eval.summary import print_summary

    given = dict(benchmark=benchmark, split=split, max_examples=max_examples, base_url=base_url, model=model,
                 api_key=api_key, backend=backend, sandbox=sandbox, attempts=attempts, concurrency=concurrency,
                 agent=agent, harness=harness, workflow=workflow, output=output, data_dir=data_dir,
                 max_tokens=max_tokens, max_turns=max_turns, temperature=temperature, timeout_s=timeout, seed=seed,
                 progress=not no_progress, rollout_workers=rollout_workers, ray_address=ray_address,
                 gateway=gateway, reward=reward, judge=judge, rubric=rubric)
    try:
        # An option left out stays unset (not None), so the benchmark's eval_defaults may fill it; a flag wins.
        opts = EvalOptions(**{k: v for k, v in given.items() if v is not None})
        result = run_eval(opts)
    except RLLMError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt as exc:  # Ctrl-C: say what was kept, no traceback
        typer.secho(str(exc) or "interrupted", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130) from None
    print_summary(result.summary)
    ray_stats = result.summary.config.get("ray")
    if ray_stats:
        n = ray_stats["workers"]
        typer.echo(f"ray: {n} worker{'' if n == 1 else 's'}, {ray_stats['worker_deaths']} died, "
                   f"{ray_stats['retried']} episodes retried, {ray_stats['lost']} lost")
    typer.echo(f"episodes: {result.episodes_path}\nsummary:  {result.summary_path}")
