"""`rllm demos BENCHMARK`: a benchmark's reference solutions played by its agent, recorded as an eval run.

    rllm demos frozenlake-3x3 --split train -n 200 -o runs/demos-fl
    rllm sft runs/demos-fl --min-reward 1 -o runs/sft-fl
    rllm train frozenlake-3x3 --init runs/sft-fl ...

The agent (the benchmark's own, or `--agent`) runs unchanged against the benchmark's oracle (oracles.py) served
as a chat endpoint (server.py); the benchmark's grader scores every episode, so a reference that does not pass is
kept out by `--min-reward 1`. Only the train split by default: demonstrations of held-out tasks would leak them.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rllm_core.errors import ConfigError, RLLMError

__all__ = ["demos_command"]


def demos_command(
    benchmark: str = typer.Argument(
        ..., help="A benchmark with an oracle: frozenlake*, terminal, harbor:PATH, geometry-*."),
    split: str = typer.Option("train", "--split", help="Split to demonstrate (never the held-out one)."),
    max_examples: int | None = typer.Option(None, "--max-examples", "-n", help="Only the first N tasks."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Run directory to write (an eval run)."),
    agent: str | None = typer.Option(None, "--agent", help="Your @rllm.rollout (default: the benchmark's agent)."),
    sandbox: str | None = typer.Option(None, "--sandbox", help="Sandbox provider of sandboxed benchmarks."),
    concurrency: int | None = typer.Option(None, "--concurrency", "-c", help="Episodes in flight at once."),
    max_turns: int | None = typer.Option(None, "--max-turns", help="Turns per episode (default: the benchmark's)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Benchmark files folder."),
    seed: int = typer.Option(0, "--seed", help="Seed for generated benchmarks."),
    variant: str = typer.Option("direct", "--variant", help="direct, or explore (Harbor: `ls -la` first)."),
    task_variants: int = typer.Option(0, "--task-variants", help="Harbor: also N renamed copies of each task."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Record a benchmark's reference solutions as episodes, played by its agent (for rllm sft)."""
    from rllm_envs.benchmarks import get_benchmark
    from rllm_envs.demos.oracles import oracle_for
    from rllm_envs.demos.server import ORACLE_MODEL, serve_oracle
    from rllm_envs.eval.runner import EvalOptions, run_eval
    from rllm_envs.eval.summary import print_summary

    try:
        if split in ("test", "heldout", "held_out", "val", "validation", "dev"):
            raise ConfigError(f"--split {split} is held out: demonstrations of it would be trained on and leak its "
                              "tasks; demonstrate the train split")
        bench = get_benchmark(benchmark)
        tasks = bench.load(split, data_dir=str(data_dir) if data_dir else None, max_examples=max_examples, seed=seed)
        if task_variants:
            data_dir = _with_variants(bench, tasks, task_variants, output, seed)
            tasks = bench.load(split, data_dir=str(data_dir), seed=seed)
            max_examples = None
        with serve_oracle(oracle_for(bench, tasks, variant)) as server:
            given = dict(benchmark=benchmark, split=split, max_examples=max_examples, base_url=server.url,
                         model=ORACLE_MODEL, sandbox=sandbox, concurrency=concurrency, agent=agent, output=output,
                         data_dir=data_dir, max_turns=max_turns, temperature=0.0, seed=seed, progress=not no_progress)
            result = run_eval(EvalOptions(**{k: v for k, v in given.items() if v is not None}))
    except RLLMError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    print_summary(result.summary)
    if task_variants:
        typer.echo(f"tasks demonstrated (originals and renamed variants): {data_dir}")
    run = result.episodes_path.parent
    typer.echo(f"episodes: {result.episodes_path}\nnext: rllm sft {run} --min-reward 1 --model MODEL -o runs/sft")


def _with_variants(bench: object, tasks: list, per_task: int, output: Path | None, seed: int) -> Path:
    """A folder holding the given Harbor tasks and `per_task` renamed variants of each (task_variants.py): under
    the run directory (`tasks/`), so the run keeps what it demonstrated."""
    import shutil
    import tempfile

    from rllm_envs.demos.task_variants import write_variants
    from rllm_envs.harbor.benchmark import HarborBenchmark

    if not isinstance(bench, HarborBenchmark):
        raise ConfigError("--task-variants renames the files of Harbor tasks (terminal, harbor:PATH); "
                          f"{getattr(bench, 'name', bench)!r} has none")
    root = output / "tasks" if output else Path(tempfile.mkdtemp(prefix="rllm-demo-tasks-"))
    shutil.rmtree(root, ignore_errors=True)
    sources = [Path(str(t.metadata["harbor_dir"])) for t in tasks]
    for src in sources:
        shutil.copytree(src, root / src.name, symlinks=True)
    write_variants(sources, root, per_task, seed=seed)
    return root
