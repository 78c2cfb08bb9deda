"""`rllm retrieve build | serve | mcp`: index a corpus once, serve it to many workers, or serve its tools over MCP."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

from rllm_core.errors import RLLMError

__all__ = ["retrieve_app"]

retrieve_app = typer.Typer(help="Search corpora: build an index, serve it over HTTP or as MCP tools.",
                           no_args_is_help=True, add_completion=False)
_CORPUS = typer.Option(None, "--corpus", help="JSONL corpus (id, title, text) or a HotpotQA file.")
_REBUILD = typer.Option(False, "--rebuild", help="Build the index again even when a cached one exists.")


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def _index(corpus: Path | None, rebuild: bool, dense: str | None, console: Console):
    from rllm_envs.search.bm25_index import open_index
    from rllm_envs.search.corpus import read_corpus
    from rllm_envs.search.dense_index import DenseIndex

    if corpus is None:
        raise RLLMError("--corpus is required: a JSONL corpus (id, title, text) or a HotpotQA file")
    started = time.monotonic()
    with console.status(f"indexing {corpus}"):
        index = DenseIndex(read_corpus(corpus), dense) if dense else open_index(corpus, rebuild=rebuild)
    console.print(f"{'dense' if dense else 'bm25'} index of {len(index)} passages ready in "
                  f"{time.monotonic() - started:.1f} s")
    return index


@retrieve_app.command("build")
def build_command(corpus: Path = typer.Argument(..., help="JSONL corpus or HotpotQA file."),
                  rebuild: bool = _REBUILD) -> None:
    """Build (or check) the cached BM25 index of a corpus."""
    from rllm_envs.search.bm25_index import index_dir

    console = Console(stderr=True)
    try:
        _index(corpus, rebuild, None, console)
        console.print(f"cached at {index_dir(corpus.expanduser())}")
    except RLLMError as exc:
        raise _fail(exc) from None


@retrieve_app.command("serve")
def serve_command(
    corpus: Path | None = _CORPUS,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8010, "--port", help="Port (0: any free one)."),
    rebuild: bool = _REBUILD,
    dense: str | None = typer.Option(None, "--dense", help="Local sentence-transformers model dir (faiss)."),
    max_concurrency: int = typer.Option(8, "--max-concurrency", help="Requests searched at once."),
    max_queue: int = typer.Option(256, "--max-queue", help="Requests waiting before 503 (busy)."),
) -> None:
    """Serve a corpus over HTTP (/retrieve as Search-R1, /search, /passage, /health)."""
    from rllm_envs.search.server import RetrievalServer

    console = Console(stderr=True)
    try:
        index = _index(corpus, rebuild, dense, console)
        server = RetrievalServer(index, host, port, kind="dense" if dense else "bm25", corpus=str(corpus),
                                 max_concurrency=max_concurrency, max_queue=max_queue).start()
    except (RLLMError, OSError) as exc:
        raise _fail(exc) from None
    console.print(f"retrieval server on {server.url} (POST /retrieve, POST /search, GET /passage/ID, GET /health); "
                  "Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


@retrieve_app.command("mcp")
def mcp_command(
    corpus: Path | None = _CORPUS,
    retriever: str | None = typer.Option(None, "--retriever", help="Use a retrieval server's URL instead."),
    transport: str = typer.Option("stdio", "--transport", help="stdio or http (streamable HTTP at /mcp)."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8765, "--port"),
    tool_log: Path | None = typer.Option(None, "--tool-log", help="Append each tool call to this JSONL."),
) -> None:
    """Serve the search tools (search, open) as an MCP server."""
    from rllm_envs.search.mcp_server import run_mcp_server
    from rllm_envs.search.remote import RemoteIndex

    console = Console(stderr=True)  # stdout is the MCP channel under stdio
    if transport not in ("stdio", "http"):
        raise _fail(ValueError(f"--transport must be stdio or http, got {transport!r}"))
    try:
        source = RemoteIndex(retriever) if retriever else _index(corpus, False, None, console)
    except RLLMError as exc:
        raise _fail(exc) from None
    run_mcp_server(source, transport, host, port, tool_log)  # type: ignore[arg-type]
