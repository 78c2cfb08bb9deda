"""Dense retrieval (an option): passages embedded by a sentence-transformers model, searched with a faiss index.

Search-R1 trains with an e5 retriever over a faiss index; this is that path for a user who has the model on the
machine. Nothing is downloaded at run time: the model must be a local directory, and a missing model, faiss or
sentence-transformers is refused by name with what to install or where to put it. BM25 stays the default.
The embeddings are normalised, so inner product is cosine similarity (faiss `IndexFlatIP`: exact search).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_core.errors import BenchmarkError
from rllm_envs.search.bm25_index import SearchHit, _snippet
from rllm_envs.search.corpus import Passage

__all__ = ["DenseIndex", "dense_unavailable"]


def dense_unavailable(model: str) -> str | None:
    """Why dense retrieval with `model` cannot run here, or None when it can."""
    missing = [pkg for mod, pkg in (("faiss", "faiss-cpu"), ("sentence_transformers", "sentence-transformers"))
               if importlib.util.find_spec(mod) is None]
    if missing:
        return f"dense retrieval needs {' and '.join(missing)} (pip install {' '.join(missing)})"
    if not Path(model).expanduser().is_dir():
        return (f"dense retrieval model {model!r} is not a directory on this machine (nothing is downloaded at run "
                "time: save a sentence-transformers model, e.g. intfloat/e5-base-v2, to a folder and pass its path)")
    return None


class DenseIndex:
    """Passages embedded by `model` (a local sentence-transformers directory) in a flat inner-product faiss index."""

    def __init__(self, passages: list[Passage], model: str, *, batch_size: int = 64) -> None:
        if (why := dense_unavailable(model)) is not None:
            raise BenchmarkError(why)
        import faiss
        from sentence_transformers import SentenceTransformer

        self.passages = passages
        self._by_id = {p.id: i for i, p in enumerate(passages)}
        self._model = SentenceTransformer(str(Path(model).expanduser()), device="cpu")
        vectors = self._model.encode([f"{p.title}\n{p.text}" for p in passages], batch_size=batch_size,
                                     normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        self._index: Any = faiss.IndexFlatIP(int(vectors.shape[1]))
        self._index.add(vectors.astype("float32"))

    def __len__(self) -> int:
        return len(self.passages)

    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[SearchHit]]:
        if not queries:
            return []
        q = self._model.encode(list(queries), normalize_embeddings=True, convert_to_numpy=True,
                               show_progress_bar=False).astype("float32")
        scores, docs = self._index.search(q, max(1, min(int(k), len(self.passages))))
        return [[SearchHit(id=self.passages[int(d)].id, title=self.passages[int(d)].title,
                           snippet=_snippet(self.passages[int(d)].text), score=round(float(s), 4))
                 for d, s in zip(row_d, row_s, strict=True) if d >= 0] for row_d, row_s in zip(docs, scores,
                                                                                               strict=True)]

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        return self.search_batch([query], k)[0]

    def get(self, doc_id: str) -> Passage | None:
        i = self._by_id.get(str(doc_id).strip())
        return None if i is None else self.passages[i]
