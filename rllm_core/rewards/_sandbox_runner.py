"""Runs inside the sandbox child: set resource limits, install the audit hook, then run the program.

Started as `python -I -B _sandbox_runner.py PROGRAM CONFIG_JSON` with the sandbox's temp dir as cwd. Kept
free of rllm imports so it runs in an isolated interpreter (-I: no user site, no PYTHONPATH).
Exit codes: the program's own, 3 for a syntax error in it.
"""

import json
import os
import resource
import sys

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_ALLOWED_WRITE = ("/dev/null",)
_BLOCKED = {
    "socket.__new__": "network access is blocked in the sandbox",
    "socket.connect": "network access is blocked in the sandbox",
    "socket.bind": "network access is blocked in the sandbox",
    "ctypes.dlopen": "loading native libraries is blocked in the sandbox",
}
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "pty.spawn")
_PATH_EVENTS = {"os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,),
                "os.chown": (0,), "os.link": (0, 1), "os.symlink": (1,), "os.truncate": (0,),
                "os.utime": (0,), "shutil.rmtree": (0,), "shutil.move": (0, 1), "shutil.copyfile": (1,)}


def _limits(cfg: dict) -> None:
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(cfg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    fsize = int(cfg["file_size_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _install_hook(root: str, allow_subprocess: bool) -> None:
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an already open descriptor
        try:
            p = realpath(fspath(path))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
        if isinstance(p, bytes):
            p = p.decode(errors="replace")
        return p == root or p.startswith(root + sep) or p in _ALLOWED_WRITE

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = [*args, None, None, None][:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing outside the working directory is blocked: {path!r}")
        elif event in _BLOCKED:
            raise PermissionError(f"sandbox: {_BLOCKED[event]}")
        elif not allow_subprocess and event in _PROCESS_EVENTS:
            raise PermissionError("sandbox: starting processes is blocked")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the working directory is blocked")

    sys.addaudithook(hook)


def main() -> None:
    program, cfg = sys.argv[1], json.loads(sys.argv[2])
    _limits(cfg)
    with open(program, encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, program, "exec")
    except SyntaxError as exc:
        print(f"SyntaxError: {exc}", file=sys.stderr)
        sys.exit(3)
    _install_hook(os.path.realpath(os.getcwd()), bool(cfg.get("allow_subprocess")))
    sys.argv = [program]
    exec(code, {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__})


if __name__ == "__main__":
    main()
