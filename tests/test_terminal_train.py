"""`rllm train terminal`: the built-in task set trains through the loop like any benchmark — each episode in its own
local sandbox, the agent's bash tool calls recorded and trained, the verifier's reward on the episode (a scripted
upstream plays the model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from rllm_testing.fake_upstream import start_fake_upstream
from rllm_testing.recording_backend import RecordingBackend
from rllm_train.config import load_config
from rllm_train.loop import train


def _responder(body: dict[str, Any]) -> Any:
    """First turn: a bash tool call (a command that depends on the attempt's seed parity); then: done."""
    messages = body.get("messages") or []
    if not any(m.get("role") == "tool" for m in messages):
        command = "echo hello > /app/hello.txt; ls /app" if (body.get("seed") or 0) % 2 else "true"
        return {"tool_call": {"name": "bash", "arguments": {"command": command}}}
    return "DONE"


def test_rllm_train_terminal_runs_episodes_in_sandboxes_and_trains_their_calls(tmp_path: Path) -> None:
    config = load_config(None, benchmark="terminal", batch_size=2, group_size=2, max_steps=1, eval_examples=0,
                         output=str(tmp_path / "run"), max_tokens=16, concurrency=4, max_train_examples=2)
    backend = None
    with start_fake_upstream(_responder) as upstream:
        backend = RecordingBackend(upstream.base_url)
        result = train(config, backend=backend, progress=False, console=Console(quiet=True))
    assert result.steps_done == 1 and backend.batches, "the step trained on rows"
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes" / "step_1.jsonl").open()]
    assert len(episodes) == 4
    for ep in episodes:  # scored by the task's verifier in the sandbox, with a reason of its own
        assert ep["artifacts"]["harbor"]["phase"] == "done"
        steps = [s for t in ep["trajectories"] for s in t["steps"]]
        assert len(steps) == 2 and steps[1]["messages"][-1]["role"] == "tool"  # the observation came back
    rows = backend.batches[0]
    # the fake upstream re-tokenizes each turn (no exact turns), so every call is a row of its own here; one row
    # per turn through rllm's policy server is tests/test_terminal_agent.py's tiny-random test
    assert rows and all(r.num_trained_tokens for r in rows)
    assert {(ep["reward"], ep["reward_reason"]) for ep in episodes} == {(0.0, "wrong_answer")}  # nothing solved
