"""The `hotpotqa` benchmark: multi-hop questions answered by an agent that searches a corpus of Wikipedia passages.

Rows come from `<data_dir>/hotpotqa/*.jsonl` (the shared 500-question dev subsample in IRCoT's format, or the
original distractor JSON lines), else from the Hub (`hotpotqa/hotpot_qa`, distractor, validation), written once
to a local JSONL so the corpus has a file to index. The corpus is the union of the rows' paragraphs (supporting
and distractor), so a search has to find a question's two supporting paragraphs among ~5,000.

Splits are by a hash of the question id (20 % test), so a held-out question is never trained on whatever order
or subset the file has. Grading follows HotpotQA's official answer normalisation: the reward is F1, `is_correct`
is exact match; supporting-passage recall (the share of the question's supporting paragraphs the agent's searches
returned, and the share it opened) is recorded per episode from its artifacts.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from rllm_core.errors import BenchmarkError
from rllm_core.rewards import RewardResult
from rllm_core.types import Episode, Task
from rllm_envs.search.answer_metrics import ANSWER_HINT, score_answer
from rllm_envs.search.corpus import hotpotqa_contexts, passage_id
from rllm_rollout.benchmarks.base import Benchmark
from rllm_rollout.benchmarks.data import hub_unreachable, read_rows, resolve_data_dir
from rllm_rollout.rollout import Rollout

__all__ = ["HotpotQA", "extract_answer", "in_test_split", "supporting_recall"]

FOLDER = "hotpotqa"
HUB_ID, HUB_CONFIG = "hotpotqa/hotpot_qa", "distractor"
TEST_PERCENT = 20
_MARKERS = [re.compile(r"<answer>(.*?)</answer>", re.S | re.I),
            re.compile(r"FINAL\s+ANSWER\**\s*:\s*\**(.*?)(?:\n\s*\n|$)", re.S | re.I),
            re.compile(r"\\boxed\{([^{}]*)\}"),
            re.compile(r"^\s*\**answer\**\s*:\s*(.+?)\s*$", re.M | re.I),
            re.compile(r"\bthe answer is\s*:?\s*(.+?)\.?\s*$", re.M | re.I)]
_LIST_NUMBER = re.compile(r"^\(?\d{1,2}[.)]\s+")


def in_test_split(question_id: str) -> bool:
    """A question's split by a hash of its id, never by its position in a file."""
    return int(hashlib.sha256(question_id.encode()).hexdigest()[:8], 16) % 100 < TEST_PERCENT


def extract_answer(response: str) -> str | None:
    """The last `<answer>...</answer>`, `FINAL ANSWER: ...`, `\\boxed{}` or `Answer: ...` of a reply, or None."""
    for pattern in _MARKERS:
        if found := pattern.findall(response or ""):
            return _LIST_NUMBER.sub("", found[-1].strip().strip("*").strip())
    return None


def supporting_recall(supporting: list[str], seen: list[str]) -> float | None:
    if not supporting:
        return None
    return len(set(supporting) & set(seen)) / len(set(supporting))


def _golds(row: dict[str, Any]) -> list[str]:
    if "answers_objects" in row:
        return [str(s) for obj in row["answers_objects"] for s in obj.get("spans") or []]
    answer = row.get("answer")
    return [str(a) for a in answer] if isinstance(answer, list) else [str(answer)]


class HotpotQA(Benchmark):
    name = "hotpotqa"
    category = "search"
    reward = "hotpotqa_f1"
    splits = ("train", "test")
    description = "HotpotQA (distractor): multi-hop questions, a search agent over their ~5k-passage corpus"
    source = f"<data_dir>/{FOLDER}/*.jsonl | hf:{HUB_ID} ({HUB_CONFIG}, validation)"
    score_names = ("em", "f1", "supporting_recall", "supporting_recall_opened")
    train_defaults = {"max_tokens": 192}
    eval_defaults = {"max_tokens": 192}

    def _local_file(self, data_dir: str | None = None) -> Path | None:
        root = resolve_data_dir(data_dir)
        if root is None or not (root / FOLDER).is_dir():
            return None
        files = sorted((root / FOLDER).glob("*.jsonl"))
        return files[0] if files else None

    @property
    def offline(self) -> bool:
        try:
            return self._local_file() is not None
        except BenchmarkError:
            return False

    def rows(self, split: str = "test") -> int | None:
        try:
            path = self._local_file()
        except BenchmarkError:
            return None
        if path is None:
            return None
        ids = [str(r.get("question_id") or r.get("_id") or r.get("id")) for r in read_rows(path, ())]
        return sum(in_test_split(q) == (split == "test") for q in ids)

    def corpus_file(self, data_dir: str | None = None) -> Path:
        """The file whose paragraphs are the corpus (the local rows, or the Hub rows written to a local JSONL)."""
        return self._local_file(data_dir) or _hub_file()

    def load(self, split: str = "test", data_dir: str | None = None, max_examples: int | None = None,
             seed: int = 0) -> list[Task]:
        self._check_split(split)
        path = self.corpus_file(data_dir)
        rows = read_rows(path, (("question_text", "question"), ("answers_objects", "answer"),
                                ("contexts", "context"), ("question_id", "_id", "id")))
        tasks = []
        for row in rows:
            qid = str(row.get("question_id") or row.get("_id") or row.get("id"))
            if in_test_split(qid) != (split == "test"):
                continue
            question = str(row.get("question_text") or row.get("question"))
            supporting = [passage_id(t, x) for t, x, sup in hotpotqa_contexts(row) if sup]
            tasks.append(self._task(len(tasks), split, f"{question}\n\n{ANSWER_HINT}", _golds(row),
                                    question=question, question_id=qid, supporting_ids=supporting,
                                    corpus=str(path)))
            if max_examples is not None and len(tasks) >= max_examples:
                break
        return tasks

    def grade(self, task: Task, response: str) -> RewardResult:
        if not (response or "").strip():
            return RewardResult.fail("no_answer_extracted", note="empty response")
        answer = extract_answer(response)
        if answer is None:
            return RewardResult.fail("format_error", note="no 'FINAL ANSWER:' (or <answer>) in the response")
        golds = task.ground_truth if isinstance(task.ground_truth, list) else [str(task.ground_truth)]
        s = score_answer(answer, golds)
        return RewardResult(reward=s.f1, reason="correct" if s.em else "wrong_answer", is_correct=bool(s.em),
                            extracted=answer, details={"scores": {"em": s.em, "f1": s.f1}})

    def score(self, task: Task, episode: Episode) -> RewardResult:
        result = super().score(task, episode)
        supporting = list(task.metadata.get("supporting_ids") or [])
        retrieved = supporting_recall(supporting, list(episode.artifacts.get("retrieved_ids") or []))
        opened = supporting_recall(supporting, list(episode.artifacts.get("opened_ids") or []))
        scores = {"em": 0.0, "f1": 0.0, **result.details.get("scores", {})}  # an ungraded answer scores 0
        if retrieved is not None:
            scores.update(supporting_recall=retrieved, supporting_recall_opened=opened or 0.0)
        return result.model_copy(update={"details": {**result.details, "scores": scores}})

    def reference_response(self, task: Task) -> str:
        golds = task.ground_truth if isinstance(task.ground_truth, list) else [task.ground_truth]
        return f"FINAL ANSWER: {golds[0]}"

    def default_rollout(self) -> Rollout:
        from rllm_envs.search.agent import search_agent

        return search_agent

    def named_agent(self, name: str) -> Rollout | None:
        """`--agent closed_book`: one chat call with the question and no tools (what search adds is measured
        against it); `--agent rag`: the question searched once, its top passages in the prompt, one call."""
        if name == "closed_book":
            from rllm_rollout.benchmarks.rollouts import single_turn

            return single_turn
        if name == "rag":
            from rllm_envs.search.agent import rag_agent

            return rag_agent
        return None


def _hub_file() -> Path:
    """The Hub's distractor validation rows as a local JSONL (written once), or a BenchmarkError saying what to do."""
    from rllm_envs.search.bm25_index import default_cache_root

    target = default_cache_root() / "hotpotqa-hub-validation.jsonl"
    if target.is_file():
        return target
    local = f"<data_dir>/{FOLDER}/<name>.jsonl (HotpotQA rows) and pass --data-dir or set RLLM_DATA_DIR"
    if (unreachable := hub_unreachable()) is not None:
        raise BenchmarkError(f"benchmark 'hotpotqa' has no local rows and {unreachable}. Put {local}.")
    try:
        import datasets

        ds = datasets.load_dataset(HUB_ID, HUB_CONFIG, split="validation")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in ds:
                f.write(json.dumps({"_id": row["id"], "question": row["question"], "answer": row["answer"],
                                    "context": row["context"], "supporting_facts": row["supporting_facts"]}) + "\n")
        tmp.rename(target)
    except Exception as exc:
        raise BenchmarkError(f"benchmark 'hotpotqa' could not read {HUB_ID} from the Hub ({type(exc).__name__}: "
                             f"{str(exc)[:200]}). Put {local}.") from exc
    return target
