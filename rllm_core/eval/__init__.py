"""`rllm eval` as a library: run a benchmark against an endpoint, write episodes.jsonl and summary.json.

    run_eval(EvalOptions(benchmark="gsm8k", max_examples=50)) -> EvalResult(summary, output_dir, ...)
    summarize(episodes, ...) -> EvalSummary          accuracy, pass@k, mean reward, reasons, tokens
    pass_at_k(n, c, k)                               the unbiased estimator
    load_agent("pkg.mod:fn") -> Rollout              with errors that say what was found
    open_endpoint(base_url, model)                   flag → `rllm model setup` → embedded server
"""

from rllm_core.eval.agent import load_agent
from rllm_core.eval.endpoint import Endpoint, check_reachable, open_endpoint
from rllm_core.eval.runner import EvalOptions, EvalResult, run_eval
from rllm_core.eval.summary import EvalSummary, pass_at_k, print_summary, summarize

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
