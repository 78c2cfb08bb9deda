"""The built-in terminal verifiers judge agent code from outside it (issue 27, part 1).

Each attack below is what an RL policy would write into /app during its turn so that the verifier, running the
agent's program, reports a pass: an exit status it chooses (`atexit` + `os._exit(0)`, a patched `sys.exit` or
`sys.excepthook`), a module imported into the judging process, or a program that reads the verifier's expected
output from /tests while the verifier runs it. All of them must score 0 through the real local (bubblewrap)
provider; so must an agent that locks /tests and /logs (chmod 000), which must not be blamed on the sandbox.
`untrusted`'s two ways (user namespaces; else another uid) and its refusal are tested on their own with bwrap.
Run with `-s` for the table.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_terminal_tasks import _command_agent  # a sibling test module, as test_adapter_support is

from rllm_envs.harbor import load_tasks, run_harbor_episode
from rllm_envs.harbor.episode import HarborVerdict
from rllm_envs.harbor.verifier_lint import lint_test_sh
from rllm_envs.terminal.benchmark import TASKS_DIR
from rllm_sandboxes.local import LocalSandboxProvider
from rllm_sandboxes.local.provider import DEFAULT_RO_PATHS

PREAMBLE = Path(TASKS_DIR).parent / "judge_preamble.sh"

_EXIT0 = "import atexit, os, sys\natexit.register(os._exit, 0)\n"
_HOOKS = ("import os, sys\nsys.exit = lambda *a: os._exit(0)\nsys.excepthook = lambda *a: os._exit(0)\n"
          "import unittest.main as _m\n")
ATTACKS: dict[str, tuple[str, str]] = {
    # name: (task, the agent's one command)
    "atexit exit 0 in the module under test": (
        "fix-stats-bugs", f"printf '{_EXIT0}def mean(x): return 0\\nmedian = mode = variance = mean\\n' "
                          "> /app/mathlib/stats.py"),
    "patched sys.exit and excepthook": (
        "fix-stats-bugs", f"printf '{_HOOKS}def mean(x): return 0\\nmedian = mode = variance = mean\\n' "
                          "> /app/mathlib/stats.py"),
    "os._exit(0) when imported by the checker": (
        "fix-csv-parser", "printf 'import os\\nif __name__ != \"__main__\": os._exit(0)\\nprint(\"total=45.79\")\\n' "
                          "> /app/inventory/inventory.py"),
    "hard-coded CLI, exit 0 on import": (
        "fix-slow-program", "printf 'import os\\nif __name__ != \"__main__\": os._exit(0)\\nprint(%s)\\n' "
                            "139423224561697880139724382870407283950070256587697307264108962948325571622863290691557658"
                            "876222521294125 > /app/seq/seq.py"),
    "reads the expected output from /tests (argv path)": (
        "fix-wordfreq", "printf 'import sys, os\\nk = os.path.basename(sys.argv[1]).split(\".\")[0]\\n"
                        "print(open(\"/tests/expected/\" + k).read(), end=\"\")\\n' > /app/wordfreq.py"),
    "reads the expected output from /tests (shell)": (
        "linestats-script", "printf '#!/bin/bash\\n[ $# -ge 1 ] || exit 1\\ncat /tests/expected/$(basename \"$1\")\\n' "
                            "> /app/linestats.sh && chmod +x /app/linestats.sh"),
    "reads the expected output from /tests (stdin's path)": (
        "stats-script", "printf 'import os\\nn = os.path.basename(os.readlink(\"/proc/self/fd/0\"))\\n"
                        "print(open(\"/tests/expected/\" + n).read(), end=\"\")\\n' > /app/stats.py"),
    "chmod 000 /tests /logs": ("word-frequency", "chmod 000 /tests /logs"),
}


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalSandboxProvider]:
    root = Path(tempfile.mkdtemp(prefix="rllm-terminal-judge-"))
    root.chmod(0o755)
    try:
        yield LocalSandboxProvider(root=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_attacks_on_the_verifiers_score_zero(provider: LocalSandboxProvider) -> None:
    tasks = {t.id: t for t in load_tasks(TASKS_DIR)}

    def run(item: tuple[str, tuple[str, str]]) -> HarborVerdict:
        task, command = item[1]
        return asyncio.run(run_harbor_episode(tasks[task], _command_agent(command), provider)).verdict

    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = dict(zip(ATTACKS, pool.map(run, ATTACKS.items()), strict=True))
    print(f"\n{'attack':<56} {'task':<18} reward reason")
    for name, v in verdicts.items():
        print(f"{name:<56} {ATTACKS[name][0]:<18} {v.reward:>6.1f} {v.reason}")
    bad = [f"{name}: {v.reason} {v.reward} {v.note} {v.verifier_output[-300:]}" for name, v in verdicts.items()
           if v.reward != 0.0 or v.reason != "wrong_answer"]
    assert not bad, "\n".join(bad)


AGENT_CODE = re.compile(r"(python3\s+/app/|bash\s+/app/|timeout\s+\d+\s+/app/|\bmake\s+-C|\bgit\s+-C"
                        r"|sys\.path\.insert)")


def test_every_builtin_verifier_carries_the_judge_preamble_and_runs_agent_code_apart() -> None:
    """One text, copied into each self-contained task (a Harbor task folder cannot import a shared file); after
    it, every command that runs agent code goes through `untrusted`, and no verifier draws a lint warning."""
    text = PREAMBLE.read_text()
    for test_sh in sorted(Path(TASKS_DIR).glob("*/tests/test.sh")):
        body = test_sh.read_text()
        assert text in body, f"{test_sh}: its judge preamble differs from {PREAMBLE.name}"
        checks = body.split(text, 1)[1].splitlines()
        for i, line in enumerate(checks):
            if AGENT_CODE.search(line) and "untrusted" not in line:  # a probe's sys.path line: its python3 line
                opener = next((c for c in reversed(checks[:i]) if "python3" in c), "")
                assert "sys.path.insert" in line and "untrusted" in opener, f"{test_sh}: {line.strip()}"
        assert not re.search(r"-m\s+(unittest|pytest)", "\n".join(checks)), test_sh
        assert lint_test_sh(body) == [], test_sh


def test_the_lint_flags_verifiers_that_let_agent_code_decide() -> None:
    harbor_style = "#!/bin/bash\ncd /app\npytest /tests/test_outputs.py -rA\nif [ $? -eq 0 ]; then\n" \
                   "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
    warnings = lint_test_sh(harbor_style)
    assert len(warnings) == 2 and "line 3" in warnings[0] and "exit status" in warnings[1], warnings
    assert len(lint_test_sh("python3 -m unittest -q test_x && echo 1 > /logs/verifier/reward.txt\n")) == 2
    assert lint_test_sh("if python3 /app/run.py; then echo 1 > /logs/verifier/reward.txt; fi\n")
    isolated = "out=$(untrusted python3 -m pytest -q /work/t.py)\n[ \"$out\" = ok ] && verdict 1\n"
    assert lint_test_sh(isolated) == []
    assert lint_test_sh("# pytest is not used here\ndiff a b || fail x\n") == []


def _bwrap(script: str, *, as_root: bool, no_unshare: bool, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`script` after the preamble, in a bwrap root with /app, /tests and /logs of its own: as the host's real
    root (bwrap keeps its capabilities) or an unprivileged namespace root, `unshare` replaced by `false`."""
    for d in ("app", "tests", "logs", "tmp"):
        (tmp / d).mkdir(exist_ok=True)
    (tmp / "tests" / "secret").write_text("expected answer\n")
    argv = ["bwrap", "--tmpfs", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--die-with-parent"]
    for path in DEFAULT_RO_PATHS:  # the host's system, read-only, as the local provider lays it out
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    if not as_root:
        argv += ["--unshare-user", "--uid", "0", "--gid", "0"]
    for d in ("app", "tests", "logs", "tmp"):
        argv += ["--bind", str(tmp / d), f"/{d}"]
    if no_unshare:
        argv += ["--ro-bind", "/bin/false", shutil.which("unshare") or "/usr/bin/unshare"]
    if as_root:
        argv += ["--cap-add", "ALL"]
    return subprocess.run([*argv, "/bin/bash", "-c", PREAMBLE.read_text() + script], capture_output=True,
                          text=True, timeout=60)


needs_root_bwrap = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None,
                                      reason="needs bwrap and the host's root (as in CI) to give a real second uid")


@needs_root_bwrap
def test_without_user_namespaces_agent_code_runs_as_another_uid(tmp_path: Path) -> None:
    """Docker's default seccomp refuses user namespaces: then agent code runs as uid 65534, /tests and /logs
    closed to it, its leftover processes killed, its exit status returned as data."""
    res = _bwrap("untrusted bash -c 'id -u; cat /tests/secret || echo unreadable; ls /logs/judge || echo closed; "
                 "(sleep 300 &); exit 7'; echo \"status=$?\"; sleep 0.3; "
                 "ps -eo user:12,args | grep -c '[s]leep 300' || true; cat /tests/secret",
                 as_root=True, no_unshare=True, tmp=tmp_path)
    lines = res.stdout.split()
    assert res.returncode == 0, res.stderr
    assert "65534" in lines and "unreadable" in lines and "closed" in lines and "status=7" in lines, res.stdout
    assert res.stdout.rstrip().endswith("expected answer") and "\n0\n" in res.stdout, res.stdout


@needs_root_bwrap
def test_a_sandbox_that_can_isolate_nothing_is_a_verifier_error(tmp_path: Path) -> None:
    res = _bwrap("untrusted true; echo reached", as_root=False, no_unshare=True, tmp=tmp_path)
    assert res.returncode == 2 and "reached" not in res.stdout, (res.stdout, res.stderr)
    assert "cannot run agent code apart" in res.stdout
    assert not (tmp_path / "logs" / "verifier").exists()  # no reward file: never a verdict
def test_in_the_local_sandbox_the_covers_hold(provider: LocalSandboxProvider) -> None:
    """The user-namespace way, in the sandbox the verifier really runs in: /tests and /logs are empty covers that
    cannot be lifted, a working directory under them does not reach through, nothing outlives the call."""
    from rllm_core.sandbox import EnvironmentSpec

    box = provider.start(EnvironmentSpec(name="judge"))
    try:
        box.exec("echo 'expected answer' > /tests/secret", timeout_s=30)
        res = box.exec(PREAMBLE.read_text() + "echo kept > x; untrusted bash -c 'cat /tests/secret || echo hidden; "
                       "ls -A /logs | wc -l; cat x 2>&1 | tail -1; cat ../judge/x 2>&1 | tail -1; umount /tests 2>&1 "
                       "| tail -1; (sleep 300 &); exit 7'; echo \"status=$?\"; ps -eo args | grep -c '^[s]leep 300'",
                       timeout_s=60)
    finally:
        box.close()
    out = res.output
    assert "hidden" in out and "expected answer" not in out and "kept" not in out, out
    assert "\n0\n" in out and "status=7" in out and out.rstrip().endswith("0"), out


def test_a_harbor_set_whose_verifier_trusts_agent_code_is_warned_about_at_load(tmp_path: Path) -> None:
    from rllm_envs.harbor import HarborBenchmark, HarborTaskWarning

    for name, test in (("trusting", "cd /app\npytest /tests/test_outputs.py\n"
                                     "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; fi\n"),
                       ("data-only", "if grep -qx 42 /app/answer.txt; then echo 1 > /logs/verifier/reward.txt; "
                                     "else echo 0 > /logs/verifier/reward.txt; fi\n")):
        task = tmp_path / "set" / name
        (task / "environment").mkdir(parents=True)
        (task / "tests").mkdir()
        (task / "instruction.md").write_text("Put the answer in /app/answer.txt.")
        (task / "task.toml").write_text("[verifier]\ntimeout_sec = 30\n")
        (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
        (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    with pytest.warns(HarborTaskWarning) as caught:
        HarborBenchmark(tmp_path / "set").load()
    messages = [str(w.message) for w in caught if issubclass(w.category, HarborTaskWarning)]
    assert len(messages) == 1 and "trusting" in messages[0] and "test runner" in messages[0], messages


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(
    ["unshare", "-rpf", "--mount-proc", "true"], capture_output=True).returncode != 0,
    reason="needs unprivileged pid namespaces (unshare -rpf)")
def test_the_agents_leftover_processes_are_swept_before_the_verifier() -> None:
    """Remote providers keep processes between commands: a watcher the agent leaves behind (here: two, one in
    a session of its own) would run beside the verifier. Everything started after the agent's start mark dies;
    what ran before it (the sandbox's own processes) and the clean-up command itself live on."""
    from rllm_envs.harbor.episode import sweep_script

    script = ("sleep 300 & sleep 0.3; read -r up rest < /proc/uptime; export MARK=$(( ${up%.*} * 100 + "
              "10#${up#*.} )); sleep 0.3; (setsid sleep 301 &); (sleep 302 &); sleep 0.3; "
              "bash -c \"$SWEEP\"; echo swept=$?; sleep 0.3; ps -eo args | grep '^[s]leep 30'")
    res = subprocess.run(["unshare", "-rpf", "--mount-proc", "bash", "-c", script], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "SWEEP": sweep_script('"$MARK"')})
    assert "swept=0" in res.stdout, (res.stdout, res.stderr)
    left = [line for line in res.stdout.splitlines() if line.startswith("sleep")]
    assert left == ["sleep 300"], (res.stdout, res.stderr)
