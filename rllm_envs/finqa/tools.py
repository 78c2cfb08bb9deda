"""The FinQA agent's tools over one question's SQLite database: `get_table_info`, `sql_query`, `calculator`.

Every tool returns text and never raises: a bad query or expression comes back as an `Error: ...` message the
model can read and fix, as a tool result would from any real API. The database is opened read-only twice over
(a `mode=ro` URI, and an authorizer that allows only reading: no PRAGMA, ATTACH, writes or DDL), a query runs
under a time budget (a recursive CTE cannot hang the episode) and its rows are capped. The calculator parses
the expression with `ast` and evaluates only numbers, arithmetic and a few math functions, never Python.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from rllm_envs.tool_calls import dispatch
from rllm_envs.tool_records import ToolLog

__all__ = ["TOOL_SPECS", "FinQATools", "calculate"]

TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_table_info",
        "description": "Describe the financial tables. Without table_name: every table's name, description and "
                       "columns. With table_name: its columns with SQL types and its first rows.",
        "parameters": {"type": "object", "properties": {"table_name": {
            "type": "string", "description": "A table name from the list (omit it to list all tables)"}},
            "required": []}}},
    {"type": "function", "function": {
        "name": "sql_query",
        "description": "Run one read-only SQLite SELECT over the tables and get the rows as JSON. Numeric columns "
                       "are REAL (e.g. SELECT \"2023\" FROM revenue WHERE item = 'Total revenue').",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string", "description": "A SELECT"}},
                       "required": ["sql"]}}},
    {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, and abs, round, "
                       "min, max, sqrt, log, exp. Example: (1250 - 1000) / 1000 * 100",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
]

_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                    getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}


class FinQATools:
    """The tools over the database `materialise` wrote at `db_path` (its `catalogue` describes the tables)."""

    def __init__(self, db_path: Path, catalogue: list[dict[str, Any]], *, max_rows: int = 50,
                 max_chars: int = 8000, time_budget_s: float = 2.0, sample_rows: int = 5,
                 log: ToolLog | None = None) -> None:
        self.catalogue, self.log = catalogue, log or ToolLog()
        self.max_rows, self.max_chars, self.sample_rows = max_rows, max_chars, sample_rows
        self.time_budget_s = time_budget_s
        self.accessed_tables: list[str] = []
        self._conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True,
                                     check_same_thread=False)
        self._conn.set_authorizer(self._authorize)
        self._deadline = 0.0
        self._conn.set_progress_handler(lambda: int(time.monotonic() > self._deadline), 2000)

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> FinQATools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _authorize(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        if action not in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _clip(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[: self.max_chars] + f"\n...(cut: {len(text) - self.max_chars} more characters)"

    def call(self, name: str, arguments: str | dict[str, Any] | None) -> str:
        """Run one tool call by name with its JSON arguments (`rllm_envs.tool_calls.dispatch`); always a string."""
        tools = {"get_table_info": self.get_table_info, "sql_query": self.sql_query, "calculator": self.calculator}
        return dispatch(name, arguments, tools, self.log, example='{"sql": "SELECT ..."}', clip=self._clip)

    # ------------------------------------------------------------------ tools
    def _find(self, table_name: str) -> dict[str, Any] | None:
        key = table_name.strip().strip("`\"'").lower()
        return next((t for t in self.catalogue if key in (t["sql_name"], t["name"].lower())), None)

    def get_table_info(self, table_name: str | None = None) -> str:
        if not table_name:
            return json.dumps([{"table": t["sql_name"], "title": t["name"], "description": t["description"],
                                "columns": [c for c, _ in t["columns"]]} for t in self.catalogue])
        entry = self._find(str(table_name))
        if entry is None:
            names = ", ".join(t["sql_name"] for t in self.catalogue)
            return f"Error: no table {table_name!r}. The tables are: {names}"
        self.accessed_tables.append(entry["sql_name"])
        cols = [c for c, _ in entry["columns"]]
        head = self._rows(f'SELECT {", ".join(f"{chr(34)}{c}{chr(34)}" for c in cols)} FROM "{entry["sql_name"]}" '
                          f"LIMIT {self.sample_rows}")
        return json.dumps({"table": entry["sql_name"], "title": entry["name"], "description": entry["description"],
                           "columns": [{"name": c, "type": t} for c, t in entry["columns"]],
                           "row_count": entry["rows"], "first_rows": head[1]})

    def _rows(self, sql: str) -> tuple[list[str], list[dict[str, Any]], bool]:
        self._deadline = time.monotonic() + self.time_budget_s
        cur = self._conn.execute(sql)
        names = [d[0] for d in cur.description or []]
        got = cur.fetchmany(self.max_rows + 1)
        cur.close()
        return names, [dict(zip(names, r, strict=True)) for r in got[: self.max_rows]], len(got) > self.max_rows

    def sql_query(self, sql: str) -> str:
        text = str(sql or "").strip().rstrip(";").strip()
        if not text:
            return "Error: the query is empty; send one SELECT statement"
        try:
            _, rows, more = self._rows(text)
        except sqlite3.DatabaseError as exc:
            msg = str(exc)
            if "not authorized" in msg or "readonly" in msg or "read-only" in msg:
                return ("Error: only SELECT queries that read the tables are allowed (no PRAGMA, ATTACH, writes or "
                        f"schema changes): {msg}")
            if "interrupted" in msg:
                return f"Error: the query ran past its {self.time_budget_s:g} s budget; simplify it"
            return f"Error: {msg}"
        except sqlite3.Warning as exc:  # "You can only execute one statement at a time."
            return f"Error: {exc}"
        out = json.dumps(rows, default=str)
        if more:
            out += f"\n(only the first {self.max_rows} rows are shown; add WHERE or LIMIT)"
        return out if rows else "[] (no rows matched)"

    def calculator(self, expression: str) -> str:
        try:
            value = calculate(str(expression))
        except (ValueError, TypeError, ZeroDivisionError, OverflowError, SyntaxError) as exc:
            return f"Error: {type(exc).__name__}: {exc}"
        return format(value, ".12g") if isinstance(value, float) else str(value)


# ---------------------------------------------------------------- calculator
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "log": math.log,
          "log10": math.log10, "exp": math.exp}
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%(?!\s*[\d.(])")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def calculate(expression: str) -> float | int:
    """Evaluate arithmetic only. "^" is power (as a spreadsheet reads it), "12%" is 0.12, "$" and thousands
    separators are dropped; names, attributes, subscripts, lambdas and every other Python construct are refused."""
    expr = expression.strip().replace("\n", " ").replace("^", "**").replace("$", "").replace("\u2212", "-")
    expr = _PERCENT.sub(r"(\1/100)", _THOUSANDS.sub("", expr))
    if not expr:
        raise ValueError("empty expression")
    if len(expr) > 500:
        raise ValueError("expression longer than 500 characters")
    return _eval(ast.parse(expr, mode="eval").body)


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 100 or abs(left) > 1e12):
            raise ValueError("power too large (exponent at most 100)")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords and len(node.args) <= 8):
        return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
    what = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else type(node).__name__
    raise ValueError(f"{what!s} is not allowed: use numbers, + - * / // % ** and {', '.join(_FUNCS)}")
