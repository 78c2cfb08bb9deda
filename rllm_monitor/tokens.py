"""One episode as the viewer shows it: long text cut, completion tokens with their text and logprob.

Token texts come from the run's own tokenizer (the config's model: ``tiny-random``, ``smollm2-135m``, a local
directory, or a Hugging Face id already in the local cache). It is loaded lazily, once per model, and only
if transformers is installed: the monitor itself never needs torch, and a tokenizer that cannot be loaded
here (a remote-only model, no transformers) just leaves every token's text null — ids and logprobs are
still shown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllm_core.runs.media import MEDIA_SCHEME

__all__ = ["MAX_TEXT", "TokenizerCache", "render_episode"]

log = logging.getLogger("rllm.monitor")

MAX_TEXT = 20_000
"""Characters of one text field shown; a longer one is cut and marked "truncated": true (a 1 MB tool output
would otherwise freeze the page)."""


def _cut(text: str) -> tuple[str, bool]:
    return (text[:MAX_TEXT], True) if len(text) > MAX_TEXT else (text, False)


def _content_text(content: Any) -> str:
    """A message's content as text: a string, the text parts of a multimodal list, else its JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    import json

    return json.dumps(content, ensure_ascii=False, default=str)


def _cut_deep(value: Any) -> Any:
    """Strings anywhere inside `value` cut to MAX_TEXT (task metadata, tool-call arguments)."""
    if isinstance(value, str):
        return _cut(value)[0]
    if isinstance(value, list):
        return [_cut_deep(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _cut_deep(v) for k, v in value.items()}
    return value


class TokenizerCache:
    """Tokenizers by model name, loaded on first use; a model whose tokenizer fails is remembered as None."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, model: str | None) -> Any:
        if not model:
            return None
        with self._lock:  # two episode requests at once must not load the same tokenizer twice
            if model not in self._loaded:
                self._loaded[model] = _load_tokenizer(model)
            return self._loaded[model]


def _load_tokenizer(model: str) -> Any:
    try:  # lazily: rllm_backends' serving package imports torch, which the monitor must not need
        from rllm_serve.models import BUILTIN_MODELS, load_tokenizer, model_dir

        if model in BUILTIN_MODELS:
            return load_tokenizer(model)
        path = Path(model_dir(model))
        if path.is_dir():
            return load_tokenizer(str(path))
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model, local_files_only=True)  # never the network from a viewer
    except Exception as exc:  # ImportError, OSError, ConfigError...: token texts are optional
        log.info("no tokenizer for %r (%s: %s); token texts are left out", model, type(exc).__name__, exc)
        return None


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str | None]:
    if tokenizer is None or not ids:
        return [None] * len(ids)
    try:
        return [str(t) for t in tokenizer.batch_decode([[i] for i in ids])]
    except Exception:
        return [None] * len(ids)


def _images(content: Any) -> list[str]:
    """The run's stored images a message shows (`rllm-media://` references; rllm_core.runs.media), in order.
    Other URLs are not fetched by the page (it loads nothing from outside the viewed folder)."""
    refs: list[str] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, Mapping):
            continue
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        source = part.get("source") if isinstance(part.get("source"), Mapping) else {}
        for ref in (url, source.get("data")):
            if isinstance(ref, str) and ref.startswith(MEDIA_SCHEME):
                refs.append(ref[len(MEDIA_SCHEME):])
    return refs


def _render_step(step: Mapping[str, Any], tokenizer: Any) -> dict[str, Any]:
    messages = []
    for m in step.get("messages") or []:
        text, truncated = _cut(_content_text(m.get("content")))
        messages.append({"role": m.get("role"), "content": text, "truncated": truncated,
                         **({"images": images} if (images := _images(m.get("content"))) else {}),
                         **({"tool_calls": _cut_deep(m["tool_calls"])} if m.get("tool_calls") else {})})
    completion, completion_cut = _cut(step.get("text") or "")
    ids = list(step.get("completion_token_ids") or [])
    logprobs = list(step.get("logprobs") or [None] * len(ids))
    texts = _token_texts(tokenizer, ids)
    return {
        "id": step.get("id"), "agent": step.get("agent"), "model": step.get("model"), "messages": messages,
        "completion": completion, "completion_truncated": completion_cut,
        "tool_calls": _cut_deep(step.get("tool_calls") or []), "reward": step.get("reward"),
        "finish_reason": step.get("finish_reason"), "error": step.get("error"), "latency_s": step.get("latency_s"),
        "token_source": step.get("token_source"), "prompt_tokens": len(step.get("prompt_token_ids") or []),
        "tokens": [{"id": i, "text": t, "logprob": lp} for i, t, lp in zip(ids, texts, logprobs, strict=False)],
    }


def render_episode(episode: Mapping[str, Any], index: int, tokenizer: Any) -> dict[str, Any]:
    """The viewer's record of one episode (see the /api/episode row of the API in rllm_monitor/api.py)."""
    task = dict(episode.get("task") or {})
    error, error_cut = _cut(episode["error"]) if episode.get("error") else (None, False)
    return {
        "index": index, "id": episode.get("id"), "task_id": task.get("id"), "attempt": episode.get("attempt"),
        "reward": episode.get("reward"), "reason": episode.get("reward_reason"),
        "is_correct": episode.get("is_correct"), "termination_reason": episode.get("termination_reason"),
        "error": error, "error_truncated": error_cut, "metrics": episode.get("metrics") or {},
        "task": _cut_deep(task), "artifacts": _cut_deep(episode.get("artifacts") or {}),
        "trajectories": [
            {"name": t.get("name"), "reward": t.get("reward"),
             "steps": [_render_step(s, tokenizer) for s in t.get("steps") or []]}
            for t in episode.get("trajectories") or []
        ],
    }
