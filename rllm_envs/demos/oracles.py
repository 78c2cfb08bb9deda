"""Oracles: what a benchmark's reference solution answers to each call its agent makes.

An oracle is `reply(messages, tools) -> message` (an assistant message: `content`, or `tool_calls`): it reads the
conversation the agent sent, as a model would, and answers with the reference's next action. The agent stays
unchanged and its environment executes the actions, so the recorded episode is a trajectory the agent could have
produced, scored by the benchmark's own grader; `rllm sft --min-reward 1` then trains on the ones that passed.

- **FrozenLake** (`frozenlake*`): the shortest safe path from the position marked P in the latest map (BFS),
  answered as the move word.
- **Harbor task sets** (`terminal`, `harbor:PATH`): the task's `solution/solve.sh`, found by the task instruction
  in the conversation, run as one `bash` tool call (or a fenced block when the agent offers no tools: its text
  format), then a reply without a command, which ends the terminal agent's episode; the `explore` variant first
  runs `ls -la`, as an agent looking around would.
- **Single-answer benchmarks that say so** (`reference_oracle = "answer"`: geometry-figures, geometry-shapes):
  the benchmark's `reference_response` of the task whose user message (its text and images) the call holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.types import Task
from rllm_envs.benchmarks.frozenlake import ACTIONS, FrozenLake, solve
from rllm_serve.tool_prompt import content_text

__all__ = ["Oracle", "answer_oracle", "frozenlake_oracle", "harbor_oracle", "oracle_for"]

Oracle = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], dict[str, Any]]

_GRID = re.compile(r"^[SFHGP]+$")


def latest_map(messages: list[dict[str, Any]]) -> list[str] | None:
    """The last block of map lines (S F H G P only, equal widths) in the conversation, with P in it."""
    for message in reversed(messages):
        lines = [line.strip() for line in content_text(message.get("content")).splitlines()]
        blocks: list[list[str]] = [[]]
        for line in lines:
            if line and _GRID.match(line):
                blocks[-1].append(line)
            elif blocks[-1]:
                blocks.append([])
        for block in reversed([b for b in blocks if b]):
            if any("P" in row for row in block) and len({len(row) for row in block}) == 1:
                return block
    return None


def frozenlake_oracle(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The first move of a shortest safe path from P (module docstring)."""
    grid = latest_map(messages)
    if grid is None:
        return {"content": "LEFT"}  # no map to read: the agent asked something else; any legal move
    desc = [row.replace("S", "F").replace("P", "S") for row in grid]
    if not any("G" in row for row in desc):  # the player stands on the goal: nothing left to do
        return {"content": "DOWN"}
    path = solve(desc)
    return {"content": ACTIONS[path[0]] if path else "LEFT"}


def _script_body(text: str) -> str:
    """solve.sh without its shebang and leading comment block (a reference's notes, "never shown to the agent", are
    not what an agent would write); comments further down may be file contents (a heredoc) and stay."""
    lines = text.splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("#")):
        lines.pop(0)
    return "\n".join(lines).strip()


def harbor_oracle(tasks: Sequence[Task], explore: bool = False) -> Oracle:
    """solve.sh of the task whose instruction the conversation holds (module docstring). `explore`: a variant
    that first looks around (`ls -la`) as an agent would, then runs the script."""
    scripts: list[tuple[str, str]] = []
    for task in tasks:
        solve_sh = Path(str(task.metadata.get("harbor_dir", ""))) / "solution" / "solve.sh"
        if solve_sh.is_file():
            scripts.append((str(task.instruction).strip(), _script_body(solve_sh.read_text())))
    if not scripts:
        raise ConfigError("no task of this set has a solution/solve.sh: there is no reference to demonstrate")

    def reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        asked = "\n".join(content_text(m.get("content")) for m in messages if m.get("role") in ("user", "system"))
        script = next((body for instruction, body in scripts if instruction and instruction in asked), None)
        if script is None:
            return {"content": "I cannot tell which task this is."}
        plan = ["ls -la", script] if explore else [script]
        acted = sum(1 for m in messages if m.get("role") == "assistant")
        if acted >= len(plan):  # the script ran (its output is the last message): finish
            return {"content": "The task is done." if tools else "DONE"}
        command = plan[acted]
        if tools:
            call = {"id": f"call_{acted}", "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
            return {"content": "", "tool_calls": [call]}
        return {"content": f"```bash\n{command}\n```"}

    return reply


def _user_key(messages: Sequence[dict[str, Any]]) -> str:
    """The last user message's content, as a key (text and image parts alike)."""
    users = [m for m in messages if m.get("role") == "user"]
    return json.dumps(users[-1].get("content") if users else None, sort_keys=True)


def answer_oracle(benchmark: Any, tasks: Sequence[Task]) -> Oracle:
    """The reference answer of the task the conversation asks (by its user message); a call about no known task
    gets an empty reply (its episode fails the grader and `--min-reward 1` drops it)."""
    answers = {_user_key(t.instruction if isinstance(t.instruction, list) else
                         [{"role": "user", "content": t.instruction}]): benchmark.reference_response(t) for t in tasks}

    def reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {"role": "assistant", "content": answers.get(_user_key(messages), "")}

    return reply


def oracle_for(benchmark: Any, tasks: Sequence[Task], variant: str = "direct") -> Oracle:
    """The oracle of `benchmark` (FrozenLake, a Harbor task set, a single-answer benchmark that names it), or a
    ConfigError naming what has one.
    `variant` "explore": Harbor demonstrations that look around first (more varied SFT data)."""
    from rllm_envs.harbor.benchmark import HarborBenchmark

    if isinstance(benchmark, FrozenLake):
        return frozenlake_oracle
    if isinstance(benchmark, HarborBenchmark):
        return harbor_oracle(tasks, explore=variant == "explore")
    if getattr(benchmark, "reference_oracle", None) == "answer":
        return answer_oracle(benchmark, tasks)
    raise ConfigError(f"benchmark {getattr(benchmark, 'name', benchmark)!r} has no reference oracle; demonstrations "
                      "come from frozenlake*, Harbor task sets (terminal, harbor:PATH) and geometry-figures / "
                      "geometry-shapes. For another benchmark with gold answers, eval a model and curate with "
                      "`rllm sft RUN --min-reward 1`")
