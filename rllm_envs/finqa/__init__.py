"""FinQA as rLLM runs it: questions over a company's financial tables in SQLite, answered by a tool-calling
agent (`get_table_info`, `sql_query`, `calculator`) and graded by exact match with numeric tolerance.

    from rllm_envs.finqa import FinQA, finqa_agent
    tasks = FinQA().load("test", data_dir="tests/data")
"""

from typing import Any

_NAMES = {"finqa_agent": "agent", "FinQA": "benchmark", "extract_final_answer": "benchmark",
          "grade_answer": "benchmark", "FinQARow": "data", "FinTable": "data", "materialise": "data",
          "read_split": "data", "TOOL_SPECS": "tools", "FinQATools": "tools", "calculate": "tools"}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    """Lazy (PEP 562): the plugin module imports this package while every plugin loads, which must stay light."""
    if name not in _NAMES:
        raise AttributeError(f"module 'rllm_envs.finqa' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"rllm_envs.finqa.{_NAMES[name]}"), name)
