"""FinQA: rows → per-task SQLite, the read-only tools, the numeric grader, and the tool-calling agent end to end
through the gateway against a scripted upstream (and briefly against rllm's own tiny policy server)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from rllm_core.errors import BenchmarkError
from rllm_core.types import Task
from rllm_envs.finqa import FinQA, FinQATools, FinTable, calculate, grade_answer, materialise
from rllm_envs.finqa import data as finqa_data
from rllm_envs.finqa.agent import parse_text_tool_calls
from rllm_envs.finqa.benchmark import extract_final_answer
from rllm_rollout.engine import run_episodes
from rllm_testing.fake_upstream import start_fake_upstream

DATA = Path(__file__).parent / "data"


@pytest.fixture
def tasks() -> list[Task]:
    return FinQA().load("test", data_dir=str(DATA))


@pytest.fixture
def tools(tasks: list[Task], tmp_path: Path) -> Any:
    tables = [FinTable.model_validate(t) for t in tasks[0].metadata["tables"]]
    catalogue = materialise(tables, tmp_path / "db.sqlite")
    with FinQATools(tmp_path / "db.sqlite", catalogue, max_rows=2, time_budget_s=0.5) as t:
        yield t


# ---------------------------------------------------------------- data
def test_fixture_loads_with_tables_and_a_multi_table_question(tasks: list[Task]) -> None:
    assert [t.id for t in tasks] == [f"finqa:test:{i}" for i in range(4)]
    multi = tasks[2]
    assert multi.metadata["question_type"] == "multi_table" and len(multi.metadata["tables"]) == 2
    assert multi.metadata["expected_tables"] == ["Consolidated statements of income", "Earnings per share"]
    assert "Bluefin Logistics" in str(multi.instruction) and "FINAL ANSWER" in str(multi.instruction)
    assert tasks[0].metadata["tables"] is tasks[1].metadata["tables"]  # one copy per company's tables
    assert FinQA().load("test", data_dir=str(DATA), max_examples=1)[0].ground_truth == "21.43%"


def test_materialise_types_numeric_columns(tasks: list[Task], tmp_path: Path) -> None:
    import sqlite3

    tables = [FinTable.model_validate(t) for t in tasks[2].metadata["tables"]]
    catalogue = materialise(tables, tmp_path / "db.sqlite")
    assert [c["sql_name"] for c in catalogue] == ["consolidated_statements_of_income", "earnings_per_share"]
    assert catalogue[0]["columns"] == [("line_item", "TEXT"), ("t_2023", "REAL"), ("t_2022", "REAL")]
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    rows = conn.execute("SELECT line_item, t_2023 FROM consolidated_statements_of_income").fetchall()
    conn.close()
    assert ("Operating margin", 12.5) in rows and ("Net income", 84.0) in rows
    with pytest.raises(BenchmarkError, match="refusing to overwrite"):
        materialise(tables, tmp_path / "db.sqlite")


def test_parse_cell_reads_filing_numbers() -> None:
    cell = finqa_data.parse_cell
    assert cell("$1,250") == 1250 and cell("(30)") == -30 and cell("12.5%") == 12.5 and cell("\u22124") == -4
    assert cell("Total revenue") is None and cell("") is None and cell(7) == 7.0


def test_a_malformed_row_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "finqa").mkdir()
    (tmp_path / "finqa" / "test.jsonl").write_text(json.dumps({"question": "q", "answer": 1, "tables": [{}]}) + "\n")
    with pytest.raises(BenchmarkError, match=r"test\.jsonl: FinQA row 0 is malformed"):
        FinQA().load("test", data_dir=str(tmp_path))
    with pytest.raises(BenchmarkError, match="no split 'dev'"):
        FinQA().load("dev", data_dir=str(tmp_path))


def test_offline_without_local_rows_says_where_to_put_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(finqa_data, "hub_unreachable", lambda: "the Hub is not reachable from here (test)")
    with pytest.raises(BenchmarkError, match=r"rLLM/finqa.*<data_dir>/finqa/test\.jsonl"):
        FinQA().load("test", data_dir=str(tmp_path))


def test_hub_tarball_in_rllm_layout_becomes_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """rLLM's data.tar.gz (question CSVs + per-company tables as pandas JSON), read with a stand-in download."""
    import csv

    tree = tmp_path / "src" / "data"
    (tree / "company_tables" / "acme").mkdir(parents=True)
    (tree / "multi_table_data").mkdir()
    table = json.dumps({"Item": {"0": "Revenue", "1": "Cost"}, "2024": {"0": "1,000", "1": "(400)"}})
    (tree / "company_tables" / "acme" / "tables_cleaned_all_companies.json").write_text(
        json.dumps({"us_gaap_Revenue": {"description": "Revenue table", "table": table}}))
    fields = ["id", "user_query", "question", "answer", "company", "question_type", "table_name", "explanation"]
    for path, qtype in ((tree / "test_finqa.csv", "single_table"), (tree / "multi_table_data" / "test_finqa.csv",
                                                                     "multi_table_calc")):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fields)
            w.writeheader()
            w.writerow({"id": 7, "user_query": "What was ACME's revenue?", "question": "revenue?", "answer": "1000",
                        "company": "acme", "question_type": qtype, "table_name": '["us_gaap_Revenue"]',
                        "explanation": ""})
    tar_path = tmp_path / "data.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(tree, arcname="data")
    import huggingface_hub

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(finqa_data, "hub_unreachable", lambda: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, repo_type: str(tar_path))
    monkeypatch.delenv("RLLM_DATA_DIR", raising=False)
    loaded = FinQA().load("test")
    assert [t.metadata["question_type"] for t in loaded] == ["multi_table_calc", "single_table"]
    assert loaded[0].metadata["tables"][0] == {"name": "us_gaap_Revenue", "description": "Revenue table",
                                               "columns": ["Item", "2024"],
                                               "rows": [["Revenue", "1,000"], ["Cost", "(400)"]]}
    assert loaded[1].metadata["expected_tables"] == ["us_gaap_Revenue"] and loaded[1].ground_truth == "1000"
    assert FinQA().grade(loaded[1], "FINAL ANSWER: $1,000 million").is_correct


# ---------------------------------------------------------------- tools
def test_table_info_lists_and_describes(tools: FinQATools) -> None:
    listing = json.loads(tools.get_table_info())
    assert [t["table"] for t in listing] == ["revenue_by_segment", "other_income_expense"]
    info = json.loads(tools.call("get_table_info", '{"table_name": "Revenue by segment"}'))
    assert info["columns"][1] == {"name": "t_2023", "type": "REAL"} and info["row_count"] == 3
    assert info["first_rows"][0] == {"item": "Product revenue", "t_2023": 1250.0, "t_2022": 1000.0}
    assert tools.accessed_tables == ["revenue_by_segment"]
    assert tools.get_table_info("nope").startswith("Error: no table 'nope'. The tables are: revenue_by_segment")


def test_sql_select_and_row_cap(tools: FinQATools) -> None:
    out = tools.call("sql_query", {"sql": "SELECT t_2023 - t_2022 AS d FROM revenue_by_segment "
                                          "WHERE item = 'Total revenue';"})
    assert json.loads(out) == [{"d": 300.0}]
    capped = tools.sql_query("SELECT item FROM revenue_by_segment")
    assert json.loads(capped.splitlines()[0]) == [{"item": "Product revenue"}, {"item": "Service revenue"}]
    assert "only the first 2 rows" in capped
    assert tools.sql_query("SELECT item FROM revenue_by_segment WHERE 0") == "[] (no rows matched)"


@pytest.mark.parametrize("sql", [
    "INSERT INTO revenue_by_segment VALUES ('x', 1, 2)", "DELETE FROM revenue_by_segment",
    "DROP TABLE revenue_by_segment", "CREATE TABLE t (a)", "ATTACH DATABASE ':memory:' AS other",
    "PRAGMA table_info(revenue_by_segment)", "SELECT load_extension('x')", "UPDATE revenue_by_segment SET t_2023 = 0",
])
def test_writes_attach_and_pragma_are_refused(tools: FinQATools, sql: str) -> None:
    out = tools.call("sql_query", json.dumps({"sql": sql}))
    assert out.startswith("Error: only SELECT queries"), out
    assert json.loads(tools.sql_query("SELECT COUNT(*) AS n FROM revenue_by_segment")) == [{"n": 3}]


def test_bad_sql_comes_back_as_text(tools: FinQATools) -> None:
    assert tools.sql_query("SELEC item FROM x") == 'Error: near "SELEC": syntax error'
    assert tools.sql_query("SELECT nope FROM revenue_by_segment") == "Error: no such column: nope"
    assert "one statement at a time" in tools.sql_query("SELECT 1; SELECT 2")
    assert tools.sql_query("  ").startswith("Error: the query is empty")
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    assert "budget" in tools.sql_query(slow)
    assert tools.call("sql_query", "{not json").startswith("Error: the arguments of sql_query are not valid JSON")
    assert tools.call("rm_rf", "{}").startswith("Error: unknown tool 'rm_rf'")
    assert tools.call("sql_query", '{"query": "SELECT 1"}').startswith("Error: bad arguments for sql_query")


def test_calculator_is_arithmetic_only(tools: FinQATools) -> None:
    assert calculate("(1,700 - 1,400) / 1,400 * 100") == pytest.approx(21.428571, rel=1e-6)
    assert calculate("2^10") == 1024 and calculate("50% * 84") == 42 and calculate("10 % 3") == 1
    assert calculate("round(sqrt(16) + max(1, 2), 1)") == 6.0 and calculate("$1,250 + 1") == 1251
    assert tools.calculator("84 / 42") == "2" and tools.calculator("1 / 3") == "0.333333333333"
    for evil in ("__import__('os').system('true')", "().__class__", "open('/etc/passwd')", "[1][0]",
                 "lambda: 1", "x + 1", "9 ** 9 ** 9", "'a' * 3"):
        out = tools.calculator(evil)
        assert out.startswith("Error:"), (evil, out)
    assert "__import__ is not allowed" in tools.calculator("__import__('os')")
    assert tools.calculator("1 / 0").startswith("Error: ZeroDivisionError")


# ---------------------------------------------------------------- grading
@pytest.mark.parametrize(("response", "gold", "reason"), [
    ("FINAL ANSWER: 21.43%", "21.43%", "correct"),
    ("So growth is about 21.4%.\n\nFINAL ANSWER: 21.4%", "21.43%", "correct"),  # within 1 %
    ("FINAL ANSWER: 0.2143", "21.43%", "correct"),  # a fraction for a percent
    ("FINAL ANSWER: 25%", "21.43%", "wrong_answer"),
    ("FINAL ANSWER: $(18) million", "-18", "correct"),
    ("FINAL ANSWER: -18", "(18)", "correct"),
    ("FINAL ANSWER: a decrease of 18", "-18", "correct"),
    ("FINAL ANSWER: 18", "-18", "wrong_answer"),
    ("FINAL ANSWER: $1.2 billion", "1,200 million", "correct"),
    ("FINAL ANSWER: 1,234", "$1,234 million", "correct"),
    ("FINAL ANSWER: In 2023, EPS was $2.00", "2.0", "correct"),  # the year is not the answer
    ("**FINAL ANSWER:** 2", "2.00", "correct"),
    ("```\nFINAL ANSWER: 3.5\n```", "3.5", "correct"),
    ("The answer is \\boxed{42}", "42", "correct"),
    ("FINAL ANSWER: Yes, fuel costs rose", "Yes", "correct"),
    ("FINAL ANSWER: No", "Yes", "wrong_answer"),
    ("FINAL ANSWER: unknown", "12", "no_answer_extracted"),
    ("", "12", "no_answer_extracted"),
    ("I think it is 12", "12", "format_error"),
])
def test_grader(response: str, gold: str, reason: str) -> None:
    result = grade_answer(response, gold)
    assert result.reason == reason, result
    assert result.reward == (1.0 if reason == "correct" else 0.0)


def test_final_answer_extraction_takes_the_last_marker() -> None:
    assert extract_final_answer("FINAL ANSWER: 1\n\nwait\n\nFINAL ANSWER: 2\n\nthanks") == "2"
    assert extract_final_answer("no marker") is None


def test_reference_responses_grade_correct(tasks: list[Task]) -> None:
    bench = FinQA()
    assert all(bench.grade(t, bench.reference_response(t)).is_correct for t in tasks)


def test_text_tool_calls_parse() -> None:
    text = 'look <tool_call>{"name": "sql_query", "arguments": {"sql": "SELECT 1"}}</tool_call> <tool_call>{bad'
    assert parse_text_tool_calls(text) == [("sql_query", '{"sql": "SELECT 1"}')]


# ---------------------------------------------------------------- the agent
def _scripted(final: str) -> Any:
    """An analyst: list the tables, read the revenue table, SELECT totals, compute, answer."""
    plan = [("get_table_info", {}), ("get_table_info", {"table_name": "revenue_by_segment"}),
            ("sql_query", {"sql": "SELECT t_2023, t_2022 FROM revenue_by_segment WHERE item = 'Total revenue'"}),
            ("calculator", {"expression": "(1700 - 1400) / 1400 * 100"})]

    def respond(body: dict[str, Any]) -> Any:
        assert [t["function"]["name"] for t in body["tools"]] == ["get_table_info", "sql_query", "calculator"]
        done = sum(m["role"] == "tool" for m in body["messages"])
        if done < len(plan):
            name, args = plan[done]
            return {"tool_call": {"name": name, "arguments": args}}
        return f"Revenue grew from 1,400 to 1,700.\nFINAL ANSWER: {final}"

    return respond


@pytest.mark.parametrize(("final", "reward"), [("21.43%", 1.0), ("30%", 0.0)])
async def test_agent_calls_tools_through_the_gateway(tasks: list[Task], final: str, reward: float) -> None:
    bench = FinQA()
    with start_fake_upstream(_scripted(final)) as up:
        (ep,) = await run_episodes(bench.default_rollout(), tasks[:1], base_url=up.base_url, benchmark=bench,
                                   progress=False)
        last = up.requests[-1]["messages"]
    assert ep.error is None and ep.reward == reward
    assert ep.reward_reason == ("correct" if reward else "wrong_answer")
    assert len(ep.steps) == 5 and ep.artifacts["turns"] == 5 and ep.artifacts["tool_calls"] == 4
    assert ep.artifacts["accessed_tables"] == ["revenue_by_segment"] and ep.artifacts["stopped"] == "answer"
    tool_msgs = [m for m in last if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [f"call_{i}" for i in range(1, 5)]
    assert json.loads(tool_msgs[2]["content"]) == [{"t_2023": 1700.0, "t_2022": 1400.0}]
    assert tool_msgs[3]["content"] == "21.4285714286"
    assert last[1]["content"].startswith("Company: Northwind Gadgets")


async def test_agent_stops_at_max_turns(tasks: list[Task]) -> None:
    task = tasks[0].model_copy(update={"metadata": {**tasks[0].metadata, "max_turns": 3}})
    bench = FinQA()
    always = {"tool_call": {"name": "sql_query", "arguments": {"sql": "DROP TABLE revenue_by_segment"}}}
    with start_fake_upstream(lambda body: always) as up:
        (ep,) = await run_episodes(bench.default_rollout(), [task], base_url=up.base_url, benchmark=bench,
                                   progress=False)
        last = up.requests[-1]["messages"]
    assert ep.error is None and ep.artifacts["turns"] == 3 and ep.artifacts["stopped"] == "max_turns"
    assert ep.reward == 0.0 and ep.reward_reason in ("format_error", "no_answer_extracted")
    assert all(m["content"].startswith("Error: only SELECT") for m in last if m["role"] == "tool")


@pytest.mark.slow
def test_agent_runs_on_rllm_policy_server() -> None:
    """tiny-random's template has no tools: the server writes them into the prompt (Hermes convention), so the
    agent keeps its native tool calls, and episodes complete."""
    import asyncio

    from rllm_serve import start_policy_server

    bench = FinQA()
    tasks = bench.load("test", data_dir=str(DATA), max_examples=2)
    tasks = [t.model_copy(update={"metadata": {**t.metadata, "max_turns": 2}}) for t in tasks]
    server = start_policy_server("tiny-random")
    try:
        eps = asyncio.run(run_episodes(bench.default_rollout(), tasks, base_url=server.base_url,
                                       model=server.model_name, benchmark=bench, sampling={"max_tokens": 8},
                                       progress=False))
    finally:
        server.stop()
    assert [e.error for e in eps] == [None, None]
    assert all(e.artifacts["tool_mode"] == "native" and 1 <= e.artifacts["turns"] <= 2 for e in eps)
    assert "<tools>" in eps[0].steps[0].messages[0]["content"] or eps[0].steps[0].prompt_token_ids
    assert all(e.reward == 0.0 and e.reward_reason in ("format_error", "no_answer_extracted", "truncated")
               for e in eps)


async def test_agent_text_tool_calls_when_asked(tasks: list[Task]) -> None:
    """tool_mode="text": tools described in the system prompt, `<tool_call>` read from the reply, results as user
    messages (what a server without tool support gets after its first 400)."""
    task = tasks[2].model_copy(update={"metadata": {**tasks[2].metadata, "tool_mode": "text"}})
    sql = ("SELECT i.t_2023 / e.t_2023 AS eps FROM consolidated_statements_of_income i, earnings_per_share e "
           "WHERE i.line_item = 'Net income' AND e.measure = 'Weighted-average diluted shares'")

    def respond(body: dict[str, Any]) -> str:
        assert "tools" not in body and "<tool_call>" in body["messages"][0]["content"]
        if body["messages"][-1]["role"] == "user" and "<tool_response" in body["messages"][-1]["content"]:
            return "FINAL ANSWER: $2.00"
        return f'<tool_call>{json.dumps({"name": "sql_query", "arguments": {"sql": sql}})}</tool_call>'

    bench = FinQA()
    with start_fake_upstream(respond) as up:
        (ep,) = await run_episodes(bench.default_rollout(), [task], base_url=up.base_url, benchmark=bench,
                                   progress=False)
        last = up.requests[-1]["messages"]
    assert ep.error is None and ep.reward == 1.0 and ep.artifacts["tool_mode"] == "text"
    assert '[{"eps": 2.0}]' in last[-1]["content"] and ep.artifacts["turns"] == 2
