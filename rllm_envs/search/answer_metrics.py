"""HotpotQA's answer metrics, as its official evaluation script defines them (hotpot_evaluate_v1.py).

An answer is normalised by lower-casing, removing ASCII punctuation, dropping the articles a/an/the and collapsing
white space; exact match compares the normalised strings; F1 is over normalised tokens (a bag, so repeats
count), except that a yes/no/noanswer on either side scores 0 unless both sides are the same. These are also
SQuAD's rules, which Search-R1 and rLLM's search agent grade by. A question with several gold spans takes the
best over them.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel

__all__ = ["ANSWER_HINT", "AnswerScore", "exact_match", "f1_precision_recall", "normalize_answer", "score_answer"]

ANSWER_HINT = "Find the facts you need, then end your reply with one line: 'FINAL ANSWER: <short answer>'."
"""The answer format every hotpotqa agent is asked for (the grader reads the line)."""

_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_precision_recall(prediction: str, gold: str) -> tuple[float, float, float]:
    pred, want = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL or want in _SPECIAL) and pred != want:
        return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred.split(), want.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


class AnswerScore(BaseModel):
    em: float
    f1: float
    precision: float
    recall: float


def score_answer(prediction: str, golds: Iterable[str]) -> AnswerScore:
    """EM and F1 of `prediction` against the best-matching gold (by F1, then EM)."""
    best = AnswerScore(em=0.0, f1=0.0, precision=0.0, recall=0.0)
    for gold in golds:
        f1, p, r = f1_precision_recall(prediction, gold)
        cand = AnswerScore(em=float(exact_match(prediction, gold)), f1=f1, precision=p, recall=r)
        if (cand.em, cand.f1) > (best.em, best.f1):
            best = cand
    return best
