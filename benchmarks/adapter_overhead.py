"""What the LangGraph adapter costs per LLM call: the same graph with and without `RLLMCallbackHandler`.

    python benchmarks/adapter_overhead.py [--runs 200] [--streaming] [--json]

The graph (planner -> tool-calling agent -> tools -> agent: 3 model calls per run) runs `--runs` times in
each mode against the deterministic fake upstream, in one process, each run in its own episode with
in-process capture on in both modes, so the only difference is the adapter: its callbacks, its call log
and the join at the end of the episode. Modes alternate run by run, so drift on a shared machine hits both
alike, and the headline figure is the median over runs of (run i with - run i without). Goal: <= 5 %
added time per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rllm_adapters._common import call_log
from rllm_adapters.langgraph import RLLMCallbackHandler
from rllm_core.context import EpisodeContext, episode_scope
from rllm_core.types import Task
from rllm_rollout.capture.inprocess import install as install_capture
from rllm_rollout.rollout import build_episode
from rllm_testing.fake_upstream import start_fake_upstream

CALLS_PER_RUN = 3


@tool
def add_one(x: int) -> int:
    """Add one to x."""
    return x + 1


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(base_url: str, streaming: bool) -> Any:
    llm = ChatOpenAI(model="fake", base_url=base_url, api_key="EMPTY", streaming=streaming, max_retries=0)
    tooled = llm.bind_tools([add_one])
    g = StateGraph(State)
    g.add_node("planner", lambda s: {"messages": [llm.invoke(s["messages"])]})
    g.add_node("agent", lambda s: {"messages": [tooled.invoke(s["messages"])]})
    g.add_node("tools", ToolNode([add_one]))
    g.add_edge(START, "planner")
    g.add_edge("planner", "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def one_run(graph: Any, with_adapter: bool, i: int) -> tuple[float, float]:
    """One episode: the graph run plus building the Episode (and, with the adapter, the join). Wall, CPU s."""
    ctx = EpisodeContext(session_id=uuid.uuid4().hex)
    config: Any = {"callbacks": [RLLMCallbackHandler()]} if with_adapter else {}
    t0, c0 = time.perf_counter(), time.process_time()
    with episode_scope(ctx):
        graph.invoke({"messages": [HumanMessage(f"question {i}")]}, config=config)
    episode = build_episode(Task(id=str(i)), None, ctx.recorder.steps(), episode_id=ctx.session_id)
    if with_adapter:
        call_log.join(episode, framework="langchain")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = episode.steps
    assert len(steps) == CALLS_PER_RUN and all(s.trainable for s in steps), "capture lost a call"
    if with_adapter:
        assert [t.name for t in episode.trajectories] == ["planner", "agent"], episode.trajectories
    return wall, cpu


def measure(runs: int, streaming: bool) -> dict[str, Any]:
    install_capture()
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with start_fake_upstream() as up, Progress(transient=True) as progress:
        graph = build_graph(up.base_url, streaming)
        for i in range(5):  # warm-up: imports, connection pool, LangGraph caches
            one_run(graph, True, i)
            one_run(graph, False, i)
        job = progress.add_task("graph runs", total=2 * runs)
        for i in range(runs):
            for mode in ((False, True) if i % 2 == 0 else (True, False)):
                results[mode].append(one_run(graph, mode, i))
                progress.advance(job)
    out: dict[str, Any] = {"runs": runs, "calls_per_run": CALLS_PER_RUN, "streaming": streaming}
    for mode, name in ((False, "without"), (True, "with")):
        walls = [w for w, _ in results[mode]]
        cpus = [c for _, c in results[mode]]
        out[name] = {
            "wall_ms_per_call": 1000 * statistics.mean(walls) / CALLS_PER_RUN,
            "median_wall_ms_per_call": 1000 * statistics.median(walls) / CALLS_PER_RUN,
            "cpu_ms_per_call": 1000 * statistics.mean(cpus) / CALLS_PER_RUN,
        }
    for key in ("wall_ms_per_call", "median_wall_ms_per_call", "cpu_ms_per_call"):
        out[f"added_{key}"] = out["with"][key] - out["without"][key]
        out[f"ratio_{key}"] = out["with"][key] / out["without"][key]
    # The headline: run i with the adapter minus run i without it (back to back), median over i. Pairing
    # cancels the drift a shared machine adds to both modes; the two medians above do not.
    paired = [w - wo for (w, _), (wo, _) in zip(results[True], results[False], strict=True)]
    out["added_paired_ms_per_call"] = 1000 * statistics.median(paired) / CALLS_PER_RUN
    out["ratio_paired"] = 1 + out["added_paired_ms_per_call"] / out["without"]["median_wall_ms_per_call"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="graph runs per mode (default 200)")
    parser.add_argument("--streaming", action="store_true", help="stream the model calls")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    res = measure(args.runs, args.streaming)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    table = Table(title=f"LangGraph adapter overhead: {args.runs} runs x {CALLS_PER_RUN} calls per mode"
                        f"{' (streaming)' if args.streaming else ''}")
    for col in ("per call", "without adapter", "with adapter", "added", "ratio"):
        table.add_column(col, justify="right")
    for key, label in (("wall_ms_per_call", "mean wall ms"), ("median_wall_ms_per_call", "median wall ms"),
                       ("cpu_ms_per_call", "mean CPU ms")):
        table.add_row(label, f"{res['without'][key]:.2f}", f"{res['with'][key]:.2f}",
                      f"{res['added_' + key]:+.3f}", f"{res['ratio_' + key]:.3f}")
    table.add_row("paired median wall ms", "", "", f"{res['added_paired_ms_per_call']:+.3f}",
                  f"{res['ratio_paired']:.3f}")
    Console().print(table)
    verdict = "within" if res["ratio_paired"] <= 1.05 else "OVER"
    Console().print(f"added time per call {res['added_paired_ms_per_call']:+.3f} ms (median of back-to-back "
                    f"pairs), ratio {res['ratio_paired']:.3f}: {verdict} the 5 % goal")


if __name__ == "__main__":
    main()
