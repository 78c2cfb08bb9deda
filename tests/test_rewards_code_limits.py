"""Graded code's limits hold across its whole process tree, and it sees an empty root (issue 27, part 2).

Bounded bombs, each started the way an audit hook never sees (`_posixsubprocess.fork_exec`, the call under
`subprocess.Popen`): many children each holding memory, many children at once, files until the disk is full.
Each must end as `resource_limit` with the limit it hit named, leaving no process behind. The empty root: the
data folder, the virtual environment, the checkout and the host's /tmp are simply not there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rllm_envs.rewards import SandboxLimits, grade_code
from rllm_envs.rewards.grade_cgroup import GradeCgroup

MBPP_TESTS = "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"
HONEST = "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n"
SPAWN = '''
import _posixsubprocess, os, sys

def spawn(*argv):
    """A child the audit hook never hears of: the C call under subprocess.Popen (Python 3.11-3.13)."""
    r, w = os.pipe()
    try:
        return _posixsubprocess.fork_exec(
            [os.fsencode(a) for a in argv], [os.fsencode(argv[0])], True, (w,), None, None,
            -1, -1, -1, -1, -1, -1, r, w, True, True, -1, -1, None, -1, -1, None, False)
    finally:
        os.close(r)
        os.close(w)
'''
MEMORY_BOMB = SPAWN + '''
for _ in range(8):  # 8 x 200 MB, each child under the per-process address-space limit
    spawn(sys.executable, "-c", "import time; b = b'x' * 200_000_000; time.sleep(60)")
import time
time.sleep(3)
''' + HONEST
PROCESS_BOMB = SPAWN + '''
started = 0
for _ in range(200):
    try:
        spawn("/bin/sleep", "61.7")
        started += 1
    except OSError:
        pass
''' + "def similar_elements(a, b):\n    return ()\n"
DISK_BOMB = '''
for i in range(1000):  # 8 MB files, each under the per-file limit, until the disk is full
    with open(f"fill{i}", "wb") as f:
        f.write(b"x" * 8_000_000)
''' + HONEST
SEES = '''
import os, sys
SEEN = {p: os.path.exists(p) for p in %r}
def similar_elements(a, b):
    bad = [p for p, seen in SEEN.items() if seen]
    assert not bad, bad
    return tuple(set(a) & set(b))
'''

needs_cgroup = pytest.mark.skipif(GradeCgroup.create(2**30, 64) is None,
                                  reason="no writable cgroup (v1 memory+pids or delegated v2) on this machine")


def _grade(code: str, **limits: float) -> dict:
    result = grade_code(f"```python\n{code}\n```", MBPP_TESTS,
                        limits=SandboxLimits(timeout_s=limits.pop("timeout_s", 30.0), **limits))
    return {"reason": result.reason, **result.details}


def _leftovers(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_an_honest_solution_passes_in_the_empty_root() -> None:
    assert _grade(HONEST)["reason"] == "correct"


def test_the_host_is_not_in_the_root() -> None:
    """The data folder, this checkout, the virtual environment, the home folder and the host's /tmp: none of it
    exists for the solution (it is not hidden: it was never put there)."""
    with tempfile.TemporaryDirectory(prefix="earlier-run-") as planted:
        paths = [planted, str(Path(__file__).resolve().parent), sys.prefix, os.path.expanduser("~/.cache"),
                 os.environ.get("RLLM_DATA_DIR") or planted, "/work/shared/data", "/etc/passwd", "/home", "/opt"]
        got = _grade(SEES % (paths,))
    assert got["reason"] == "correct", got


@needs_cgroup
def test_a_memory_bomb_spread_over_children_is_a_resource_limit() -> None:
    got = _grade(MEMORY_BOMB, memory_mb=512)
    assert got["reason"] == "resource_limit" and got["limit_hit"] == "memory", got
    assert got["peak_memory_bytes"] <= 512 * 2**20, got
    assert not _leftovers("b'x' * 200_000_000")


@needs_cgroup
def test_a_process_bomb_is_a_resource_limit_and_leaves_nothing() -> None:
    got = _grade(PROCESS_BOMB, processes=16)
    assert got["reason"] == "resource_limit" and got["limit_hit"] == "processes", got
    time.sleep(0.2)
    assert not _leftovers("sleep 61.7")


def test_a_disk_bomb_is_a_resource_limit() -> None:
    before = os.statvfs(tempfile.gettempdir())
    got = _grade(DISK_BOMB, disk_mb=32)
    after = os.statvfs(tempfile.gettempdir())
    assert got["reason"] == "resource_limit" and got["limit_hit"] == "disk", got
    grown = (before.f_bavail - after.f_bavail) * before.f_frsize
    assert grown < 16 * 2**20, f"the host's temp folder lost {grown / 2**20:.0f} MiB"
