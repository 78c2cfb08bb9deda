"""Where rllm keeps what it builds for reuse (converted models, search indexes, judge verdicts): `$RLLM_HOME`, else
`~/.cache/rllm`. One definition, so a test or a user that moves it moves all of them."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["rllm_home"]


def rllm_home() -> Path:
    return Path(os.environ.get("RLLM_HOME") or Path.home() / ".cache" / "rllm")
