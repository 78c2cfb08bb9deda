"""A search corpus: passages with an id, a title and a text, read from JSONL or gathered from HotpotQA's contexts.

JSONL is the layout Search-R1's and FlashRAG's corpora use (one object per line; `contents` as "title\\ntext" is
read too). HotpotQA's distractor setting gives each question ~10 Wikipedia paragraphs (2 supporting, the rest
distractors); their union over a file is the corpus, so a search has to find the right paragraphs among other
questions' ones. A passage's id is a hash of its title and text: the same paragraph met by several questions is
one passage, and a question's supporting paragraphs are found by the same id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rllm_core.errors import BenchmarkError

__all__ = ["Passage", "file_digest", "hotpotqa_contexts", "hotpotqa_corpus", "passage_id", "read_corpus"]


class Passage(BaseModel):
    """One retrievable passage."""

    id: str
    title: str = ""
    text: str


def passage_id(title: str, text: str) -> str:
    return "p" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


def file_digest(path: Path) -> str:
    """A content hash of a corpus file: the key its cached index is stored under (a changed file is re-indexed)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _json_lines(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 (closed below; lines are read lazily)
    except OSError as exc:
        raise BenchmarkError(f"cannot read corpus file {path}: {exc}") from exc
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkError(f"{path}:{lineno} is not valid JSON ({exc.msg}); each line must be one "
                                     "JSON object") from exc
            if not isinstance(row, dict):
                raise BenchmarkError(f"{path}:{lineno} is a JSON {type(row).__name__}, expected an object")
            yield lineno, row


def read_corpus(path: str | Path) -> list[Passage]:
    """Passages from a JSONL corpus (`id`, `title`, `text`; or Search-R1's `contents` = "title\\ntext"), or from a
    HotpotQA file (rows with `contexts` or `context`): the format is told by the first row."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise BenchmarkError(f"corpus file {path} does not exist")
    rows = _json_lines(path)
    first = next(rows, None)
    if first is None:
        raise BenchmarkError(f"corpus file {path} has no rows")
    if "contexts" in first[1] or "context" in first[1]:
        return hotpotqa_corpus(path)
    seen: set[str] = set()
    out = []
    for lineno, row in [first, *rows]:
        if "text" not in row and "contents" in row:
            title, _, text = str(row["contents"]).partition("\n")
            row = {"title": title.strip('"'), "text": text, **{k: v for k, v in row.items() if k != "contents"}}
        row.setdefault("id", passage_id(str(row.get("title", "")), str(row.get("text", ""))))
        try:
            passage = Passage.model_validate({**row, "id": str(row["id"])})
        except ValidationError as exc:
            raise BenchmarkError(f"{path}:{lineno}: a corpus row needs 'text' (and optionally 'id', 'title'): "
                                 f"{exc.errors()[0]['msg']}") from None
        if passage.id in seen:
            raise BenchmarkError(f"{path}:{lineno}: passage id {passage.id!r} appears twice; ids must be unique")
        seen.add(passage.id)
        out.append(passage)
    return out


def hotpotqa_contexts(row: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(title, text, is_supporting) of one HotpotQA row: IRCoT's processed `contexts`, or the original
    `context` ([title, sentences] pairs, or the Hub's {title: [...], sentences: [...]}) with `supporting_facts`."""
    if "contexts" in row:
        return [(str(c.get("title", "")), str(c.get("paragraph_text", c.get("text", ""))),
                 bool(c.get("is_supporting"))) for c in row["contexts"]]
    context, facts = row.get("context") or [], row.get("supporting_facts") or []
    if isinstance(context, dict):  # the Hub's columnar form
        context = list(zip(context.get("title", []), context.get("sentences", []), strict=False))
    if isinstance(facts, dict):
        facts = list(zip(facts.get("title", []), facts.get("sent_id", []), strict=False))
    supporting = {str(f[0]) for f in facts}
    return [(str(t), "".join(s) if isinstance(s, list) else str(s), str(t) in supporting) for t, s in context]


def hotpotqa_corpus(path: Path) -> list[Passage]:
    """Every distinct paragraph of a HotpotQA file's rows."""
    out: dict[str, Passage] = {}
    for _, row in _json_lines(path):
        for title, text, _ in hotpotqa_contexts(row):
            pid = passage_id(title, text)
            out.setdefault(pid, Passage(id=pid, title=title, text=text))
    if not out:
        raise BenchmarkError(f"{path} has no HotpotQA contexts to build a corpus from")
    return list(out.values())
