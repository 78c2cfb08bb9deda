"""Installing a harness the way its users do (npm or pip), into a folder of its own under `$RLLM_HOME/harnesses`.

Each pinned version gets `<RLLM_HOME>/harnesses/<name>-<version>/`; a `.rllm-installed` file written last marks a
finished install, so a half-done one (Ctrl-C, a failed download) is redone, never used. Only the package
registries are reached (npm's, PyPI): a harness whose install needs any other download fails here, with the
failing step's output, and is reported so (never faked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rllm_core.harness import HarnessError, HarnessInstall

__all__ = ["MARKER", "harness_home", "installed_copy", "npm_install", "pip_install"]

MARKER = ".rllm-installed"


def harness_home(name: str, version: str) -> Path:
    """Where `name` at `version` is (to be) installed."""
    base = Path(os.environ.get("RLLM_HOME") or Path.home() / ".rllm") / "harnesses"
    return base / f"{name}-{version}"


def installed_copy(name: str, version: str, mount: str = "/opt/rllm-harness") -> HarnessInstall | None:
    home = harness_home(name, version)
    return HarnessInstall(home, version, mount) if (home / MARKER).is_file() else None


def _run(argv: list[str], step: str, home: Path, timeout_s: float = 1800) -> float:
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=home)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"{step} failed: {exc}") from None
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise HarnessError(f"{step} failed (exit {done.returncode}): {' '.join(argv)}", tail)
    return time.monotonic() - start


def _fresh(home: Path) -> None:
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    os.chmod(home, 0o755)


def _finish(home: Path, version: str, seconds: float) -> HarnessInstall:
    for folder, _dirs, files in os.walk(home):  # sandbox uids read and run it, never write it
        os.chmod(folder, 0o755)
        for f in files:
            path = os.path.join(folder, f)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))  # executables stay executable
    (home / MARKER).write_text(f"{version}\n{seconds:.1f}\n")
    return HarnessInstall(home, version)


def npm_install(name: str, package: str, version: str) -> HarnessInstall:
    """`npm install --prefix HOME package@version` (its postinstall fetches platform binaries from npm too)."""
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessError(f"installing {name} needs npm (Node.js): apt-get install nodejs npm")
    home = harness_home(name, version)
    _fresh(home)
    seconds = _run([npm, "install", "--prefix", str(home), "--no-audit", "--no-fund", "--no-save",
                    f"{package}@{version}"], f"npm install {package}@{version}", home)
    return _finish(home, version, seconds)


def pip_install(name: str, package: str, version: str, python_version: tuple[int, int]) -> HarnessInstall:
    """`pip install --target HOME/site package==version` for the sandbox's Python (`python_version`)."""
    home = harness_home(name, version)
    _fresh(home)
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts",
            "--target", str(home / "site"), f"{package}=={version}"]
    if python_version != sys.version_info[:2]:  # wheels for the sandbox's interpreter, not ours
        argv += ["--python-version", f"{python_version[0]}.{python_version[1]}", "--only-binary=:all:"]
    seconds = _run(argv, f"pip install {package}=={version}", home)
    return _finish(home, version, seconds)
