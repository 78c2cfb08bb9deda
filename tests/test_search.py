"""The search environment: the corpus and its BM25 index (equal to bm25s used directly), the cache (a corrupt index
is a clear error and rebuilt on request), HotpotQA's splits and official answer metrics, and the tools."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bm25s
import pytest

from rllm_core.errors import BenchmarkError
from rllm_core.net import free_port
from rllm_envs.search.answer_metrics import exact_match, f1_precision_recall, score_answer
from rllm_envs.search.bm25_index import BM25Index, IndexUnreadable, index_dir, open_index
from rllm_envs.search.corpus import Passage, hotpotqa_corpus, read_corpus
from rllm_envs.search.hotpotqa import HotpotQA, extract_answer, in_test_split
from rllm_envs.search.tools import SearchTools
from rllm_envs.tool_records import ToolLog

CORPUS = [
    ("Shirley Temple", "Shirley Temple Black was an American actress and diplomat, Chief of Protocol of the US."),
    ("Kiss and Tell (1945 film)", "Kiss and Tell is a 1945 comedy film starring Shirley Temple as Corliss Archer."),
    ("Meet Corliss Archer", "Meet Corliss Archer, a program from radio's Golden Age, ran from 1943 to 1956."),
    ("Janet Waldo", "Janet Waldo was an American radio and voice actress, the voice of Judy Jetson."),
    ("Apple Remote", "The Apple Remote is a remote control device released by Apple for the Apple TV."),
    ("Front Row", "Front Row is a discontinued media center application for Apple's Mac, driven by the remote."),
    ("Oiseau Blanc", "L'Oiseau Blanc was a French biplane that disappeared in 1927 trying to cross the Atlantic."),
    ("Charles Nungesser", "Charles Eugene Nungesser was a French ace pilot who flew L'Oiseau Blanc with Coli."),
]
QUERIES = ["who played Corliss Archer in Kiss and Tell", "Apple remote control", "French pilot Atlantic 1927",
           "radio actress voice"]

# (prediction, gold, EM, F1) as hotpot_evaluate_v1.py computes them (run on these inputs outside the repository)
OFFICIAL = [("Chief of Protocol", "Chief of Protocol", 1, 1.0), ("the Chief of Protocol.", "Chief of Protocol", 1, 1.0),
            ("chief protocol", "Chief of Protocol", 0, 0.8), ("Yes", "yes", 1, 1.0), ("yes", "no", 0, 0),
            ("no answer", "noanswer", 0, 0), ("An apple a day", "apple", 0, 0.666667),
            ("1969 until 1974", "from 1969 until 1974", 0, 0.857143), ("9,984", "9984", 1, 1.0),
            ("Charles Eugène", "Charles Eugene", 0, 0.5), ("the the the", "the", 1, 0),
            ("Shirley Temple Black", "Shirley Temple", 0, 0.8), ("  multiple   spaces ", "multiple spaces", 1, 1.0),
            ("U.S.", "US", 1, 1.0), ("New York City, New York", "New York", 0, 0.571429), ("yes it is", "yes", 0, 0),
            ("", "Paris", 0, 0), ("Paris", "", 0, 0)]


def write_corpus(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": f"d{i}", "title": t, "text": x}) + "\n"
                            for i, (t, x) in enumerate(CORPUS)))
    return path


@contextmanager
def search_mcp_over_http(corpus: Path, home: Path, tool_log: Path | None = None) -> Iterator[str]:
    """`rllm retrieve mcp --transport http` on a free port, as a user starts it: its /mcp URL; always stopped."""
    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", "rllm", "retrieve", "mcp", "--corpus", str(corpus), "--transport", "http",
               "--port", str(port), *(["--tool-log", str(tool_log)] if tool_log else [])]
    proc = subprocess.Popen(command, env={**os.environ, "RLLM_HOME": str(home)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the MCP server did not listen within 60 s"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def index() -> BM25Index:
    return BM25Index.build([Passage(id=f"d{i}", title=t, text=x) for i, (t, x) in enumerate(CORPUS)])


# ---------------------------------------------------------------- BM25
def test_bm25_results_equal_the_librarys_own(index: BM25Index) -> None:
    texts = [f"{t}\n{x}" for t, x in CORPUS]
    reference = bm25s.BM25()
    reference.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    for query in QUERIES:
        docs, scores = reference.retrieve(bm25s.tokenize([query], stopwords="en", show_progress=False), k=4,
                                          show_progress=False)
        want = [(f"d{int(d)}", round(float(s), 4)) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]
        assert [(h.id, h.score) for h in index.search(query, 4)] == want
    assert index.search("Corliss Archer Kiss and Tell", 2)[0].id == "d1"
    assert index.search("zzzz qqqq") == []  # nothing shares a term: no zero-score filler


def test_the_index_is_cached_by_content_and_a_corrupt_one_is_a_clear_error(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    first = open_index(corpus, cache_root=tmp_path / "cache")
    folder = index_dir(corpus, tmp_path / "cache")
    assert folder.is_dir() and len(first) == len(CORPUS)
    monkeypatch.setattr(BM25Index, "build", lambda *a: pytest.fail("a cached index was built again"))
    again = open_index(corpus, cache_root=tmp_path / "cache")
    assert [h.id for h in again.search(QUERIES[0])] == [h.id for h in first.search(QUERIES[0])]
    (folder / "passages.jsonl").write_text('{"id": "d0", "text": "half a file"}\n')
    with pytest.raises(IndexUnreadable, match=r"unreadable.*--rebuild"):
        open_index(corpus, cache_root=tmp_path / "cache")
    monkeypatch.undo()
    rebuilt = open_index(corpus, cache_root=tmp_path / "cache", rebuild=True)
    assert len(rebuilt) == len(CORPUS) and len(BM25Index.load(folder)) == len(CORPUS)
    with corpus.open("a") as f:  # a changed corpus is another index, never the stale one
        f.write(json.dumps({"id": "d99", "title": "New", "text": "a new passage about zebras"}) + "\n")
    assert index_dir(corpus, tmp_path / "cache") != folder
    assert open_index(corpus, cache_root=tmp_path / "cache").search("zebras")[0].id == "d99"


def test_corpus_rows_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(BenchmarkError, match="appears twice"):
        read_corpus(bad)
    bad.write_text('{"id": "a", "title": "no text"}\n')
    with pytest.raises(BenchmarkError, match=r"bad.jsonl:1.*needs 'text'"):
        read_corpus(bad)
    r1 = tmp_path / "r1.jsonl"
    r1.write_text(json.dumps({"id": "7", "contents": '"Title"\nbody text'}) + "\n")  # Search-R1's layout
    assert read_corpus(r1) == [Passage(id="7", title="Title", text="body text")]
    with pytest.raises(BenchmarkError, match="does not exist"):
        open_index(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------- HotpotQA
def test_hotpotqa_corpus_splits_and_supporting_passages(shared_data_dir: Path) -> None:
    source = shared_data_dir / "hotpotqa" / "dev_subsampled.jsonl"
    corpus = {p.id for p in hotpotqa_corpus(source)}
    bench = HotpotQA()
    train, test = bench.load("train", str(shared_data_dir)), bench.load("test", str(shared_data_dir))
    assert len(train) + len(test) == 500 and len(test) == bench.rows("test") and 80 <= len(test) <= 120
    train_ids, test_ids = ({t.metadata["question_id"] for t in s} for s in (train, test))
    assert not train_ids & test_ids and all(in_test_split(q) for q in test_ids)
    assert len(corpus) > 4000
    assert all(len(t.metadata["supporting_ids"]) == 2 and set(t.metadata["supporting_ids"]) <= corpus
               for t in train + test)
    first = test[0]
    assert first.ground_truth == ["Chief of Protocol"]
    assert bench.grade(first, bench.reference_response(first)).reward == 1
    assert all(score_answer(g, t.ground_truth).em == 1 for t in test for g in t.ground_truth)


@pytest.mark.parametrize(("prediction", "gold", "em", "f1"), OFFICIAL)
def test_answer_metrics_equal_the_official_script(prediction: str, gold: str, em: int, f1: float) -> None:
    assert exact_match(prediction, gold) == bool(em)
    assert f1_precision_recall(prediction, gold)[0] == pytest.approx(f1, abs=1e-6)


def test_grading_reads_the_final_answer_and_scores_f1() -> None:
    bench = HotpotQA()
    task = bench._task(0, "test", "q", ["Chief of Protocol"])
    ok = bench.grade(task, "She was ambassador.\nFINAL ANSWER: the Chief of Protocol")
    assert (ok.reward, ok.reason, ok.is_correct) == (1.0, "correct", True)
    part = bench.grade(task, "FINAL ANSWER: Protocol chief officer")
    assert part.reason == "wrong_answer" and 0 < part.reward < 1 and part.details["scores"]["f1"] == part.reward
    assert bench.grade(task, "I think it is Chief of Protocol").reason == "format_error"
    assert bench.grade(task, "").reason == "no_answer_extracted"
    assert extract_answer("The answer is: 2. William Earl Johns\nThe answer is: 2. William Earl Johns") == \
        "William Earl Johns"
    assert extract_answer("x <answer>yes</answer> y") == "yes"


# ---------------------------------------------------------------- the tools
def test_tools_search_open_and_record_every_call(index: BM25Index) -> None:
    tools = SearchTools(index, ToolLog())
    found = tools.call("search", '{"query": "Kiss and Tell Corliss Archer", "k": 2}')
    assert found.startswith("[d1] Kiss and Tell (1945 film):") and found.count("\n") == 1
    assert tools.call("open", {"doc_id": "[d0]"}).startswith("Shirley Temple\nShirley Temple Black")
    assert tools.retrieved_ids[:2] == ["d1", "d2"] and tools.opened_ids == ["d0"]
    errors = [tools.call("open", {"doc_id": "nope"}), tools.call("search", {"query": " "}),
              tools.call("search", {"query": "x", "k": "many"}), tools.call("search", "{not json"),
              tools.call("fetch", {}), tools.call("search", {"q": "x"})]
    assert all(e.startswith("Error:") for e in errors), errors
    records = tools.log.records()
    assert [r["name"] for r in records] == ["search", "open", "open", "search", "search", "search", "fetch", "search"]
    assert records[0]["arguments"] == {"query": "Kiss and Tell Corliss Archer", "k": 2}
    assert records[0]["result_chars"] == len(found) and records[0]["error"] is None and records[0]["latency_s"] >= 0
    assert all(r["error"] for r in records[2:]) and records[5]["arguments"] == "{not json"


def test_dense_retrieval_refuses_by_name_what_is_missing(tmp_path: Path) -> None:
    import importlib.util

    from rllm_envs.search.dense_index import DenseIndex, dense_unavailable

    why = dense_unavailable(str(tmp_path / "no-model"))
    assert why is not None
    if importlib.util.find_spec("faiss") is None:
        assert "faiss-cpu" in why and "pip install" in why
    else:
        assert "is not a directory on this machine" in why
    with pytest.raises(BenchmarkError, match="dense retrieval"):
        DenseIndex([Passage(id="a", text="x")], str(tmp_path / "no-model"))


def test_the_retrieve_cli_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rllm.cli.app import build_app

    runner, app = CliRunner(), build_app()
    missing = runner.invoke(app, ["retrieve", "build", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "does not exist" in missing.output and "Traceback" not in missing.output
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    built = runner.invoke(app, ["retrieve", "build", str(corpus)], env={"RLLM_HOME": str(tmp_path / "home")})
    assert built.exit_code == 0, built.output
    (folder,) = (tmp_path / "home" / "search").iterdir()
    (folder / "meta.json").write_text("{broken")
    corrupt = runner.invoke(app, ["retrieve", "build", str(corpus)], env={"RLLM_HOME": str(tmp_path / "home")})
    assert corrupt.exit_code == 2 and "--rebuild" in corrupt.output
    fixed = runner.invoke(app, ["retrieve", "build", str(corpus), "--rebuild"],
                          env={"RLLM_HOME": str(tmp_path / "home")})
    assert fixed.exit_code == 0 and "8 passages" in fixed.output
