"""Episode context crosses threads only where we carry it: bind_context / submit."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from rllm_core.context import (
    EpisodeContext,
    agent_scope,
    bind_context,
    current_agent,
    current_episode,
    episode_scope,
    submit,
)
from rllm_core.types import Step


def test_raw_thread_loses_context_bind_context_keeps_it() -> None:
    ctx = EpisodeContext(session_id="s1")
    seen: dict[str, object] = {}
    with episode_scope(ctx), agent_scope("solver"):
        t = threading.Thread(target=lambda: seen.setdefault("raw", current_episode()))
        t.start()
        t.join()
        t = threading.Thread(target=bind_context(lambda: seen.setdefault("bound", (current_episode(),
                                                                                  current_agent()))))
        t.start()
        t.join()
        with ThreadPoolExecutor(2) as pool:
            seen["submit"] = submit(pool, current_episode).result()
    assert seen["raw"] is None
    assert seen["bound"] == (ctx, "solver")
    assert seen["submit"] is ctx
    assert current_episode() is None and current_agent() is None


def test_recorder_is_thread_safe() -> None:
    ctx = EpisodeContext(session_id="s")

    def work(i: int) -> None:
        for j in range(50):
            ctx.recorder.record(Step(id=f"{i}-{j}"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    ids = [s.id for s in ctx.recorder.steps()]
    assert len(ids) == 400 and len(set(ids)) == 400
