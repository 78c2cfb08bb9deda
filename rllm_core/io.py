"""Episodes on disk: JSONL (exact round trip) and, optionally, Parquet."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from rllm_core.errors import ConfigError
from rllm_core.types import Episode

__all__ = ["append_jsonl", "iter_jsonl", "read_jsonl", "read_parquet", "write_jsonl", "write_parquet"]


def write_jsonl(path: str | Path, episodes: Iterable[Episode]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(ep.model_dump_json() + "\n")
            n += 1
    return n


def append_jsonl(path: str | Path, episode: Episode) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(episode.model_dump_json() + "\n")


def iter_jsonl(path: str | Path) -> Iterator[Episode]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Episode.model_validate_json(line)
            except ValueError as exc:
                raise ConfigError(f"{path}:{lineno} is not a valid Episode record: {exc}") from exc


def read_jsonl(path: str | Path) -> list[Episode]:
    return list(iter_jsonl(path))


def write_parquet(path: str | Path, episodes: Iterable[Episode]) -> int:
    """One row per episode; nested records are stored as JSON text so the round trip stays exact."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("Parquet needs pyarrow: pip install 'rllm[parquet]'") from exc
    eps = list(episodes)
    table = pa.table({
        "id": [e.id for e in eps],
        "task_id": [e.task.id for e in eps],
        "reward": [e.reward for e in eps],
        "episode_json": [e.model_dump_json() for e in eps],
    })
    pq.write_table(table, str(path))
    return len(eps)


def read_parquet(path: str | Path) -> list[Episode]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("Parquet needs pyarrow: pip install 'rllm[parquet]'") from exc

    col = pq.read_table(str(path), columns=["episode_json"]).column("episode_json").to_pylist()
    return [Episode.model_validate_json(s) for s in col]
