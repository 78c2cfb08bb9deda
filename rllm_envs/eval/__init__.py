"""`rllm eval` as a library: run a benchmark against an endpoint, write episodes.jsonl and summary.json.

    run_eval(EvalOptions(benchmark="gsm8k", max_examples=50)) -> EvalResult(summary, output_dir, ...)
    summarize(episodes, ...) -> EvalSummary          accuracy, pass@k, mean reward, reasons, tokens
    pass_at_k(n, c, k)                               the unbiased estimator
    load_agent("pkg.mod:fn") -> Rollout              with errors that say what was found
    open_endpoint(base_url, model)                   flag → `rllm model setup` → embedded server
"""

from importlib import import_module
from typing import Any

_HOME = {
    "load_agent": "rllm_rollout.agent_loader",
    "Endpoint": "endpoint", "check_reachable": "endpoint", "open_endpoint": "endpoint",
    "EvalOptions": "runner", "EvalResult": "runner", "run_eval": "runner",
    "EvalSummary": "summary", "pass_at_k": "summary", "print_summary": "summary", "summarize": "summary",
}
"""Where each public name lives: imported on first use (PEP 562), so `rllm model` and the CLI's start-up, which
import `rllm_envs.eval.cli`, do not load the eval engine and the model stack behind it."""


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'rllm_envs.eval' has no attribute {name!r}")
    home = _HOME[name]
    return getattr(import_module(home if "." in home else f"rllm_envs.eval.{home}"), name)


__all__ = [
    "Endpoint",
    "EvalOptions",
    "EvalResult",
    "EvalSummary",
    "check_reachable",
    "load_agent",
    "open_endpoint",
    "pass_at_k",
    "print_summary",
    "run_eval",
    "summarize",
]
