"""FinQA rows and their tables: read from `<data_dir>/finqa/<split>.jsonl` or from the Hub's `rLLM/finqa`, and
each question's tables written into a SQLite database its tools query.

A row is self-contained (question, gold answer, company, and the financial tables the agent may look at), so a
task travels to a worker process without a shared table store. rLLM publishes FinQA as one tarball
(`data.tar.gz`: question CSVs per split plus `company_tables/<company>/tables_cleaned_all_companies.json`), not
as rows `datasets` can load, so the Hub path downloads that file with `huggingface_hub` (as LiveCodeBench's
files are read) and turns it into the same rows; a question gets every table of its company, as rLLM's agent
does (it has to find the right one). Local JSONL, the offline path, uses `FinQARow`'s fields (see
tests/data/finqa/test.jsonl).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import sqlite3
import tarfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from rllm_core.errors import BenchmarkError
from rllm_rollout.benchmarks.data import hub_unreachable, read_rows, resolve_data_dir, split_file

__all__ = ["HUB_FILE", "HUB_ID", "SPLITS", "FinQARow", "FinTable", "materialise", "parse_cell", "read_split",
           "sql_names"]

HUB_ID = "rLLM/finqa"
HUB_FILE = "data.tar.gz"
SPLITS = ("train", "val", "test")
FOLDER = "finqa"
_EMPTY = {"", "-", "—", "–", "n/a", "na", "nm", "none", "null", "nan"}
_NUMERIC = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


class FinTable(BaseModel):
    """One financial table: a name the agent refers to it by, and its cells (the first column labels the rows)."""

    name: str
    description: str = ""
    columns: list[str]
    rows: list[list[Any]] = Field(default_factory=list)


class FinQARow(BaseModel):
    """One question and the tables it is asked over; `expected_tables` names the ones the answer comes from."""

    id: str
    question: str
    answer: str
    company: str = ""
    question_type: str = ""
    tables: list[FinTable]
    expected_tables: list[str] = Field(default_factory=list)
    explanation: str = ""

    @field_validator("answer", "id", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        """A JSONL gold may be written as a number (12.5); it is graded as the text a filing would print."""
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


# ---------------------------------------------------------------- reading
def read_split(split: str, data_dir: str | None = None, max_examples: int | None = None) -> tuple[list[FinQARow], str]:
    """The rows of `split` and where they came from: the local JSONL when there is one, else the Hub."""
    path = split_file(resolve_data_dir(data_dir), FOLDER, split)
    if path is not None:
        raw = read_rows(path, ("question", "answer", "tables"), max_examples)
        where = str(path)
    else:
        raw, where = _hub_rows(split, max_examples, data_dir), f"hf:{HUB_ID}"
    rows = []
    for i, r in enumerate(raw):
        try:
            rows.append(FinQARow.model_validate({**r, "id": str(r.get("id", i))}))
        except ValidationError as exc:
            raise BenchmarkError(f"{where}: FinQA row {i} is malformed: {exc.errors()[0]['loc']}: "
                                 f"{exc.errors()[0]['msg']} (fields: {sorted(r)})") from exc
    return rows, where


def _hub_rows(split: str, max_examples: int | None, data_dir: str | None) -> list[dict[str, Any]]:
    needs = f"benchmark 'finqa' needs {HUB_FILE} of the Hugging Face dataset {HUB_ID!r}"
    local = f"<data_dir>/{FOLDER}/{split}.jsonl (fields: {', '.join(FinQARow.model_fields)})"
    if (unreachable := hub_unreachable()) is not None:
        raise BenchmarkError(f"{needs}, and {unreachable}. Put the rows as JSONL at {local} and pass --data-dir "
                             "(or set HF_HUB_OFFLINE=1 to use a copy in the Hugging Face cache).")
    try:
        import huggingface_hub as hub

        tar_path = Path(hub.hf_hub_download(HUB_ID, HUB_FILE, repo_type="dataset"))
        root = _extract(tar_path)
        return _rows_from_tree(root, split, max_examples)
    except BenchmarkError:
        raise
    except Exception as exc:
        raise BenchmarkError(f"{needs}, which could not be read ({type(exc).__name__}: {str(exc)[:200]}). "
                             f"Put the rows as JSONL at {local} and pass --data-dir instead.") from exc


def _extract(tar_path: Path) -> Path:
    """Unpack once next to the cached tarball (keyed by its content hash); `filter="data"` refuses links out of
    the tree and absolute paths, so a tampered archive cannot write elsewhere."""
    digest = hashlib.sha256(tar_path.read_bytes()).hexdigest()[:16]
    root = Path.home() / ".cache" / "rllm" / "finqa" / digest
    done = root / ".complete"
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar_path, "r:gz") as tar:
            tar.extractall(root, filter="data")
        done.touch()
    return root


def _json_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value or "").strip()
    if not text:
        return []
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return [text]
    return [str(v) for v in parsed] if isinstance(parsed, list) else [str(parsed)]


def _rows_from_tree(root: Path, split: str, max_examples: int | None) -> list[dict[str, Any]]:
    """rLLM's layout: `<split>_finqa.csv` (single-table) and `multi_table_data/<split>_finqa.csv`, columns
    id, user_query, question, answer, company, question_type, table_name (JSON list), explanation."""
    csvs = sorted(root.rglob(f"{split}_finqa.csv"))
    if not csvs:
        raise BenchmarkError(f"{HUB_ID}'s {HUB_FILE} has no {split}_finqa.csv (unpacked at {root})")
    companies = {p.parent.name.lower(): p for p in root.rglob("tables_cleaned_all_companies.json")}
    cache: dict[str, list[dict[str, Any]]] = {}
    csv.field_size_limit(1 << 30)
    out: list[dict[str, Any]] = []
    for path in csvs:
        with open(path, encoding="utf-8", newline="") as f:
            for rec in csv.DictReader(f):
                company = str(rec.get("company") or "").strip()
                key = company.lower()
                if key not in cache:
                    cache[key] = _company_tables(companies[key]) if key in companies else []
                out.append({"id": f"{path.parent.name}/{rec.get('id', len(out))}",
                            "question": rec.get("user_query") or rec.get("question") or "",
                            "answer": rec.get("answer") or "", "company": company,
                            "question_type": rec.get("question_type") or "", "tables": cache[key],
                            "expected_tables": _json_list(rec.get("table_name")),
                            "explanation": rec.get("explanation") or ""})
                if max_examples is not None and len(out) >= max_examples:
                    return out
    return out


def _company_tables(path: Path) -> list[dict[str, Any]]:
    """A company's tables: `{name: {"description": ..., "table": <pandas to_json text>}}`, where the table is
    column-oriented (`{col: {row_index: value}}`, pandas' default) or a list of records."""
    tables = []
    for name, info in json.loads(path.read_text(encoding="utf-8")).items():
        body = info.get("table", "{}") if isinstance(info, dict) else "{}"
        data = json.loads(body) if isinstance(body, str) else body
        if isinstance(data, dict) and data:
            columns = [str(c) for c in data]
            index = sorted({k for col in data.values() if isinstance(col, dict) for k in col},
                           key=lambda k: (0, int(k)) if str(k).isdigit() else (1, str(k)))
            rows = [[(data[c] or {}).get(k) if isinstance(data[c], dict) else None for c in data] for k in index]
        elif isinstance(data, list) and data and isinstance(data[0], dict):
            columns = [str(c) for c in data[0]]
            rows = [[r.get(c) for c in data[0]] for r in data]
        else:
            continue
        desc = str(info.get("description") or "") if isinstance(info, dict) else ""
        tables.append({"name": str(name), "description": desc, "columns": columns, "rows": rows})
    return tables


# ---------------------------------------------------------------- SQLite
def parse_cell(value: Any) -> float | None:
    """A table cell as a number, or None when it is not one: "$1,234.5" → 1234.5, "(12)" → -12, "7%" → 7.0.
    A percent keeps its number (the column says it is a percent), as the filing prints it."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().replace("\u2212", "-").replace("$", "").replace(",", "").replace(" ", "")
    negative = text.startswith("(") and text.endswith(")")
    text = text.strip("()").rstrip("%")
    if not _NUMERIC.match(text):
        return None
    number = float(text)
    return -number if negative else number


def _ident(name: str, taken: set[str], fallback: str) -> str:
    base = re.sub(r"[^0-9a-zA-Z_]+", "_", str(name)).strip("_").lower() or fallback
    if base[0].isdigit():
        base = f"t_{base}"
    out, n = base, 2
    while out in taken:
        out, n = f"{base}_{n}", n + 1
    taken.add(out)
    return out


def sql_names(tables: list[FinTable]) -> list[tuple[str, list[str]]]:
    """(SQL table name, SQL column names) per table: lower-case identifiers, unique, never starting with a digit,
    so the model can write them unquoted."""
    taken: set[str] = set()
    out = []
    for t in tables:
        cols: set[str] = set()
        out.append((_ident(t.name, taken, "table"), [_ident(c, cols, f"col_{i}") for i, c in enumerate(t.columns)]))
    return out


def _is_empty(value: Any) -> bool:
    return value is None or str(value).strip().lower() in _EMPTY


def materialise(tables: list[FinTable], path: Path) -> list[dict[str, Any]]:
    """Write `tables` into a new SQLite file at `path`, one SQL table each; a column whose every non-empty cell
    is a number is REAL (empty cells NULL), others TEXT. Returns the catalogue the tools show: per table its SQL
    name, original name, description and (column, type) pairs."""
    if path.exists():
        raise BenchmarkError(f"refusing to overwrite {path}: a FinQA database is built in a fresh place")
    catalogue = []
    conn = sqlite3.connect(path)
    try:
        for table, (sql_name, cols) in zip(tables, sql_names(tables), strict=True):
            width = len(cols)
            if not width:  # a table pandas read as empty: nothing to query
                continue
            cells = [(list(r) + [None] * width)[:width] for r in table.rows]
            types = []
            for j in range(width):
                values = [r[j] for r in cells if not _is_empty(r[j])]
                numeric = j > 0 and bool(values) and all(parse_cell(v) is not None for v in values)
                types.append("REAL" if numeric else "TEXT")
            ddl = ", ".join(f'"{c}" {t}' for c, t in zip(cols, types, strict=True))
            conn.execute(f'CREATE TABLE "{sql_name}" ({ddl})')
            typed = [[(parse_cell(v) if not _is_empty(v) else None) if t == "REAL" else
                      (None if v is None else str(v)) for v, t in zip(r, types, strict=True)] for r in cells]
            conn.executemany(f'INSERT INTO "{sql_name}" VALUES ({", ".join("?" * width)})', typed)
            catalogue.append({"sql_name": sql_name, "name": table.name, "description": table.description,
                              "columns": list(zip(cols, types, strict=True)), "rows": len(cells)})
        conn.commit()
    finally:
        conn.close()
    return catalogue
