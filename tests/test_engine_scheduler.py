"""The engine's scheduler alone (rllm_serve.scheduler): admission, the step's token budget, preemption, and the
end of requests it cannot run — without a model (the engine tests run it with one, exactly)."""

from __future__ import annotations

import threading
from collections import deque

import torch

from rllm_serve.kv_pool import KVPool
from rllm_serve.sampling import SamplingParams
from rllm_serve.scheduler import POOL_TOO_SMALL, Scheduler
from rllm_serve.sequence import GenerationRequest
from rllm_serve.work import Work


def _scheduler(blocks: int = 16, max_batch_size: int = 4, max_step_tokens: int = 64, block_size: int = 4):
    ended: list[tuple[str, str]] = []
    retired: list[Work] = []
    pool = KVPool(1, 1, 2, blocks, torch.float32, torch.device("cpu"), block_size=block_size)
    sched = Scheduler(pool, max_batch_size, max_step_tokens, vocab=100,
                      end_request=lambda req, reason, error: ended.append((reason, error)), on_retire=retired.append)
    return sched, ended, retired


def _request(prompt: list[int], n: int = 1) -> GenerationRequest:
    return GenerationRequest(prompt, SamplingParams(max_tokens=4), sink=lambda event: None, n=n)  # type: ignore[arg-type]


def test_admission_fills_the_batch_slots_and_refuses_tokens_outside_the_vocabulary() -> None:
    sched, ended, _ = _scheduler(max_batch_size=4)
    waiting = deque([_request([1, 2, 3], n=2), _request([5, 200]), _request([4, 5], n=2), _request([6])])
    admitted = sched.admit(waiting, threading.Condition(), version=0)
    assert len(admitted) == 3 and sched.running == 4  # 2 + (refused) + 2 slots; the last request waits
    assert [len(waiting), ended[0][0]] == [1, "error"] and "outside the model's vocabulary" in ended[0][1]


def test_a_step_feeds_every_decoding_choice_and_prefills_within_the_token_budget() -> None:
    sched, _, _ = _scheduler(max_step_tokens=8, blocks=32)
    waiting = deque([_request(list(range(1, 21))), _request(list(range(30, 50)))])
    sched.admit(waiting, threading.Condition(), version=0)
    older = sched.work[0]
    plan = sched.plan()
    assert [(w, n) for w, n in plan] == [(older, 8)]  # chunked prefill: the older prompt first, 8 tokens a step
    assert len(older.table.blocks) == 2  # the blocks for those 8 positions are reserved


def test_a_prompt_the_whole_pool_cannot_hold_is_ended_with_a_reason_not_left_waiting() -> None:
    sched, ended, retired = _scheduler(blocks=3)  # 2 usable blocks of 4 positions
    sched.admit(deque([_request(list(range(1, 31)))]), threading.Condition(), version=0)
    assert sched.plan() == [] and sched.work == []
    assert ended == [("error", POOL_TOO_SMALL)] and len(retired) == 1


def test_cancelled_requests_leave_the_batch_and_the_queue() -> None:
    sched, ended, retired = _scheduler()
    running, queued = _request([1, 2]), _request([3, 4])
    sched.admit(deque([running]), threading.Condition(), version=0)
    waiting = deque([queued])
    running.cancel()
    queued.cancel()
    sched.drop_cancelled(waiting, threading.Condition())
    assert sched.work == [] and not waiting and [r for r, _ in ended] == ["cancelled", "cancelled"]
    assert len(retired) == 1 and retired[0].request is running
