"""On-policy distillation (`rllm train --teacher MODEL_OR_URL`): the student samples, the teacher scores the
student's own tokens, and the per-token reverse KL is the advantage.

For each train row (the student's sampled trajectory, packed as usual) the teacher gives logπ_T of every token
given its prefix; on a trained token t the advantage becomes

    A_t = task_coef · A_task + teacher_coef · (logπ_T(t) − logπ_S(t))

where logπ_S is what the student sampled the token with (the row's `sampling_logprobs`). The second term is the
negative of the per-token reverse-KL estimate: a token the teacher finds likelier than the student did is pushed
up, one it finds unlikely is pushed down, so the student learns the teacher's behaviour on the states it visits
itself (Agarwal et al., GKD; the Tinker cookbook's on-policy distillation). `task_coef 0` is pure distillation;
the default mixes it with the task reward's advantage.

Teachers:
- a model on this machine (`--teacher smollm2-135m`, a directory, a run): loaded once, scored by a forward pass;
- a server that returns prompt logprobs (`--teacher MODEL@URL` or `URL`): vLLM's `/v1/completions` with
  `prompt_logprobs` (what vLLM, and any server copying its API, answers). Key: `$RLLM_TEACHER_API_KEY`.

Teacher calls never go through the gateway: they are no Steps and are never trained on. Each step's calls are
recorded apart in the run directory's `teacher.jsonl` (rows, tokens, seconds, mean reverse KL) and as
`distill/*` metrics.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from rllm_core.errors import ConfigError, TrainingError
from rllm_train.packing import TrainRow

__all__ = ["HttpTeacher", "LocalTeacher", "Teacher", "distill_rows", "make_teacher", "score_and_distill"]


class Teacher(Protocol):
    name: str

    def logprobs(self, rows: Sequence[TrainRow]) -> list[list[float]]:
        """logπ_T of each row's tokens given their prefix, token-aligned (position 0: 0.0, it has no prefix)."""
        ...

    def close(self) -> None: ...


class LocalTeacher:
    """A model loaded on this machine (fp32), scored one row at a time by a forward pass."""

    def __init__(self, spec: str, device: str = "cpu") -> None:
        import torch

        from rllm_serve.models import load_model

        self.name = spec
        self.model = load_model(spec, dtype=torch.float32, device=device).model.eval()
        self.device = device

    def logprobs(self, rows: Sequence[TrainRow]) -> list[list[float]]:
        import torch

        out = []
        with torch.inference_mode():
            for row in rows:
                ids = torch.tensor([row.tokens], device=self.device)
                logits = self.model(ids).logits[0, :-1].float()
                picked = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
                out.append([0.0, *picked.tolist()])
        return out

    def close(self) -> None:
        self.model = None


class HttpTeacher:
    """A server answering vLLM's `prompt_logprobs` on `/v1/completions` (the prompt sent as token ids)."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 300.0) -> None:
        self.url = url.rstrip("/")
        key = os.environ.get("RLLM_TEACHER_API_KEY")
        self._http = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {key}"} if key else {})
        self.model = model or self._only_model()
        self.name = f"{self.model}@{self.url}"

    def _only_model(self) -> str:
        try:
            models = self._http.get(f"{self.url}/models").raise_for_status().json().get("data") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise ConfigError(f"--teacher {self.url}: could not list its models ({exc}); give MODEL@URL") from None
        if len(models) != 1:
            raise ConfigError(f"--teacher {self.url} serves {len(models)} models; name one: MODEL@{self.url}")
        return str(models[0]["id"])

    def logprobs(self, rows: Sequence[TrainRow]) -> list[list[float]]:
        return [self._one(row) for row in rows]

    def _one(self, row: TrainRow) -> list[float]:
        body = {"model": self.model, "prompt": list(row.tokens), "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0}
        try:
            reply = self._http.post(f"{self.url}/completions", json=body)
        except httpx.HTTPError as exc:
            raise TrainingError(f"the teacher {self.name} could not be reached: {exc}") from None
        if reply.status_code >= 400:
            raise TrainingError(f"the teacher {self.name} answered HTTP {reply.status_code}: {reply.text[:300]}")
        scored = (reply.json().get("choices") or [{}])[0].get("prompt_logprobs")
        if not isinstance(scored, list) or len(scored) != len(row.tokens):
            raise TrainingError(f"the teacher {self.name} returned no prompt_logprobs for {len(row.tokens)} tokens "
                                "(a server that answers vLLM's prompt_logprobs is needed, e.g. vLLM)")
        out = [0.0]
        for token, entry in zip(row.tokens[1:], scored[1:], strict=True):
            found = (entry or {}).get(str(token))
            if not isinstance(found, dict) or not isinstance(found.get("logprob"), int | float):
                raise TrainingError(f"the teacher {self.name} gave no logprob for token {token}")
            out.append(max(float(found["logprob"]), -1e4))  # -inf (a token it never emits) stays finite
        return out

    def close(self) -> None:
        self._http.close()


def make_teacher(spec: str, device: str = "cpu") -> Teacher:
    """`MODEL@URL` or `URL` (http/https): a server; anything else: a model loaded here."""
    if spec.startswith(("http://", "https://")) or "@http" in spec:
        model, _, url = spec.rpartition("@") if "@http" in spec else ("", "", spec)
        return HttpTeacher(url, model or None)
    return LocalTeacher(spec, device)


def distill_rows(rows: Sequence[TrainRow], teacher_logprobs: Sequence[Sequence[float]], teacher_coef: float,
                 task_coef: float = 1.0) -> tuple[list[TrainRow], dict[str, float]]:
    """Rows with A_t = task_coef·A_task + teacher_coef·(logπ_T − logπ_S) on trained tokens (module docstring),
    and the step's distill/* metrics."""
    out, kl_sum, n = [], 0.0, 0
    for row, teacher in zip(rows, teacher_logprobs, strict=True):
        if len(teacher) != len(row.tokens):
            raise TrainingError(f"the teacher scored {len(teacher)} tokens of a {len(row.tokens)}-token row")
        advantages = list(row.advantages)
        for t, trained in enumerate(row.loss_mask):
            if not trained:
                continue
            gap = teacher[t] - row.sampling_logprobs[t]
            if not math.isfinite(gap):
                raise TrainingError(f"the teacher's logprob of token {t} is not finite ({teacher[t]})")
            advantages[t] = task_coef * row.advantages[t] + teacher_coef * gap
            kl_sum, n = kl_sum - gap, n + 1
        out.append(row.model_copy(update={"advantages": advantages}))
    return out, {"distill/reverse_kl": kl_sum / max(n, 1), "distill/tokens": float(n)}


def score_and_distill(teacher: Teacher, rows: Sequence[TrainRow], teacher_coef: float, task_coef: float
                      ) -> tuple[list[TrainRow], dict[str, Any]]:
    """The teacher's call for a step's rows, timed, then `distill_rows`."""
    started = time.monotonic()
    scored = teacher.logprobs(rows)
    rows_out, metrics = distill_rows(rows, scored, teacher_coef, task_coef)
    metrics["distill/teacher_s"] = time.monotonic() - started
    metrics["distill/rows"] = float(len(rows))
    return rows_out, metrics
