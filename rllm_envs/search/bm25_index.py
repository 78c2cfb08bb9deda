"""A BM25 index over a corpus, built once with `bm25s` and cached on disk under the corpus file's content hash.

bm25s (a maintained library, Lucene's BM25 variant, sparse scores in numpy) rather than a hand-written scorer:
a search agent's reward depends on what retrieval returns, so the scorer should be the one others measure with.
tantivy or pyserini serve a Wikipedia-sized index (docs/search.md); bm25s builds ~5,000 passages in about a
second and a million in minutes on this CPU (benchmarks/retrieval_scale.py).

The cache lives in `$RLLM_HOME/search/<corpus stem>-<content hash>/` rather than beside the data: the shared
data folder is read-only to runs, and a changed corpus file gets a new hash, hence a new index, never a stale one.
An index that cannot be read (a half-written folder, a disk error) is a one-line error that says how to rebuild.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from rllm_core.errors import BenchmarkError
from rllm_core.home import rllm_home
from rllm_envs.search.corpus import Passage, file_digest, read_corpus

__all__ = ["BM25Index", "IndexUnreadable", "SearchHit", "default_cache_root", "index_dir", "open_index"]

FORMAT = 1
SNIPPET_CHARS = 240
logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every build at DEBUG


class IndexUnreadable(BenchmarkError):
    """A cached index that cannot be loaded; `rebuild=True` (`--rebuild`) writes it again."""


class SearchHit(BaseModel):
    """One search result: what the `search` tool shows (the passage is read in full with `open`)."""

    id: str
    title: str
    snippet: str
    score: float


def default_cache_root() -> Path:
    return rllm_home() / "search"


def index_dir(corpus: Path, cache_root: Path | None = None) -> Path:
    return (cache_root or default_cache_root()) / f"{corpus.stem}-{file_digest(corpus)}"


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " ..."


class BM25Index:
    """Passages and their BM25 index. `search` is safe from many threads (bm25s' retrieval reads only)."""

    def __init__(self, passages: list[Passage], retriever: object, tokenizer: object) -> None:
        self.passages = passages
        self._by_id = {p.id: i for i, p in enumerate(passages)}
        self._retriever, self._tokenizer = retriever, tokenizer
        self._tokenize_lock = threading.Lock()  # the tokenizer's vocabulary is a shared dict

    def __len__(self) -> int:
        return len(self.passages)

    # ---------------------------------------------------------------- building and loading
    @classmethod
    def build(cls, passages: list[Passage]) -> BM25Index:
        import bm25s
        from bm25s.tokenization import Tokenizer

        if not passages:
            raise BenchmarkError("cannot index an empty corpus")
        tokenizer = Tokenizer(stopwords="en")
        tokens = tokenizer.tokenize([f"{p.title}\n{p.text}" for p in passages], return_as="tuple",
                                    show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        return cls(passages, retriever, tokenizer)

    def save(self, folder: Path, *, corpus_digest: str = "") -> None:
        """Write the index to `folder` through a temporary sibling renamed at the end (never half a folder)."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            self._retriever.save(str(tmp), show_progress=False)  # type: ignore[attr-defined]
            self._tokenizer.save_vocab(str(tmp))  # type: ignore[attr-defined]
            self._tokenizer.save_stopwords(str(tmp))  # type: ignore[attr-defined]
            with open(tmp / "passages.jsonl", "w", encoding="utf-8") as f:
                for p in self.passages:
                    f.write(p.model_dump_json() + "\n")
            (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "passages": len(self.passages),
                                                       "corpus_digest": corpus_digest}))
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, folder: Path) -> BM25Index:
        import bm25s
        from bm25s.tokenization import Tokenizer

        try:
            meta = json.loads((folder / "meta.json").read_text())
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, this rllm reads format {FORMAT}")
            with open(folder / "passages.jsonl", encoding="utf-8") as f:
                passages = [Passage.model_validate_json(line) for line in f if line.strip()]
            if len(passages) != meta.get("passages"):
                raise ValueError(f"{len(passages)} passages where meta.json says {meta.get('passages')}")
            retriever = bm25s.BM25.load(str(folder), show_progress=False, verbosity=0)
            tokenizer = Tokenizer(stopwords="en")
            tokenizer.load_vocab(str(folder))
            tokenizer.load_stopwords(str(folder))
        except Exception as exc:
            raise IndexUnreadable(f"the search index at {folder} is unreadable ({type(exc).__name__}: {exc}); "
                                  "rebuild it with `rllm retrieve build CORPUS --rebuild` (or delete the folder)"
                                  ) from None
        return cls(passages, retriever, tokenizer)

    # ---------------------------------------------------------------- queries
    def search_batch(self, queries: Sequence[str], k: int = 5) -> list[list[SearchHit]]:
        """The top `k` passages of each query (passages that share no term with it are left out)."""
        if not queries:
            return []
        k = max(1, min(int(k), len(self.passages)))
        with self._tokenize_lock:
            ids = self._tokenizer.tokenize([str(q) for q in queries], update_vocab=False,  # type: ignore[attr-defined]
                                           return_as="ids", show_progress=False)
        docs, scores = self._retriever.retrieve(ids, k=k, show_progress=False, n_threads=1)  # type: ignore[attr-defined]
        out = []
        for row_docs, row_scores in zip(docs, scores, strict=True):
            hits = []
            for doc, score in zip(row_docs, row_scores, strict=True):
                if float(score) <= 0:
                    continue
                p = self.passages[int(doc)]
                hits.append(SearchHit(id=p.id, title=p.title, snippet=_snippet(p.text), score=round(float(score), 4)))
            out.append(hits)
        return out

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        return self.search_batch([query], k)[0]

    def get(self, doc_id: str) -> Passage | None:
        i = self._by_id.get(str(doc_id).strip())
        return None if i is None else self.passages[i]


def open_index(corpus: str | Path, *, cache_root: Path | None = None, rebuild: bool = False) -> BM25Index:
    """The index of `corpus` (a JSONL corpus or a HotpotQA file): loaded from its cache, else built and cached.
    An unreadable cache raises IndexUnreadable unless `rebuild`."""
    path = Path(corpus).expanduser()
    if not path.is_file():
        raise BenchmarkError(f"corpus file {path} does not exist")
    folder = index_dir(path, cache_root)
    if folder.is_dir() and not rebuild:
        return BM25Index.load(folder)
    started = time.monotonic()
    index = BM25Index.build(read_corpus(path))
    index.save(folder, corpus_digest=folder.name.rsplit("-", 1)[-1])
    index.built_s = time.monotonic() - started  # type: ignore[attr-defined]
    return index
