"""Runs inside the sandbox, and holds the wire protocol between a solution and its judge.

    _sandbox_runner.py PROGRAM CONFIG_JSON   run a program; its exit code is its result (run_python)
    _sandbox_runner.py --worker CONFIG_JSON  host an untrusted solution; answer the judge's requests with data

Code owns the process it runs in: it can exit 0 early, raise SystemExit, patch builtins, walk frames up to
a harness, print any marker, write to any descriptor it holds. So a graded solution never shares a process
with its tests: it runs here, in a worker, and the judge (code.py run as a script, with sandbox.py's
plumbing) sees it only as data on two pipes. Arguments or stdin go out; results or stdout come back,
decoded to exact builtin types (`_untag`), so an object whose `__eq__` always says yes never crosses — at
most a reference to it does, which equals nothing but itself. What the worker sends is never trusted: the
solution may rewrite every line below, which only changes what data it answers with.
Kept free of rllm imports so it runs in an isolated interpreter (-I: no user site, no PYTHONPATH).
"""

import builtins
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
MAX_MESSAGE = 256 * 1024 * 1024
MAX_REPLY = 64 * 1024 * 1024
LCB = "lcb"  # call target ["lcb", name]: LiveCodeBench's `Solution().name`, else the function `name`


def limits(cfg: dict) -> None:
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(cfg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    fsize = int(cfg["file_size_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg.get("processes"):  # per user namespace: the fallback process cap where no cgroup counts the tree
        n = int(cfg["processes"])
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


def install_hook(root: str, allow_subprocess: bool, deny_read: tuple = (), allow_native: bool = False) -> None:
    """Refuse writes outside `root`, reads under `deny_read` (answer keys) and of other processes' /proc
    entries, signals to other processes, sockets, native libraries (unless allowed: the judge's trusted
    tests may use numpy) and new processes (unless allowed). An audit hook is a speed bump for in-process
    code, not a wall: the wall is that nothing in the solution's process decides a grade."""
    realpath, fspath, sep, pid = os.path.realpath, os.fspath, os.sep, os.getpid()
    own_proc = "/proc/" + os.readlink("/proc/self") if os.path.islink("/proc/self") else "/proc/self"

    def resolve(path: object) -> str | None:
        if isinstance(path, int):
            return None  # an already open descriptor
        try:
            p = realpath(fspath(path))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return ""
        return p.decode(errors="replace") if isinstance(p, bytes) else p

    def under(p: str, top: str) -> bool:
        return p == top or p.startswith(top + sep)

    def may_write(path: object) -> bool:
        p = resolve(path)
        return p is None or under(p, root) or p in _ALLOWED_WRITE

    def may_read(path: object) -> bool:
        p = resolve(path)
        if p is None:
            return True
        parts = p.split(sep)
        other_proc = len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and not under(p, own_proc)
        return not other_proc and not any(under(p, d) for d in deny_read)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = [*args, None, None, None][:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and not may_write(path):
                raise PermissionError(f"sandbox: writing outside the working directory is blocked: {path!r}")
            if not writes and not may_read(path):
                raise PermissionError(f"sandbox: reading {path!r} is blocked (answer keys, other processes)")
        elif event in _BLOCKED and not (allow_native and event == "ctypes.dlopen"):
            raise PermissionError(f"sandbox: {_BLOCKED[event]}")
        elif not allow_subprocess and event in _PROCESS_EVENTS:
            raise PermissionError("sandbox: starting processes is blocked")
        elif event in ("os.kill", "os.killpg") and args and args[0] != pid:
            raise PermissionError("sandbox: signalling other processes is blocked")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not may_write(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the working directory is blocked")

    sys.addaudithook(hook)


# ---------------------------------------------------------------- the wire: length-prefixed JSON, tagged values
class ProtocolError(Exception):
    """A message the protocol does not allow (what a tampered worker sends)."""


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send(fd: int, msg: list) -> None:
    data = json.dumps(msg, separators=(",", ":")).encode()
    write_all(fd, len(data).to_bytes(8, "big") + data)


def _read_exact(fd: int, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        if not (chunk := os.read(fd, min(n - len(data), 1 << 20))):
            raise EOFError("the pipe closed")
        data += chunk
    return bytes(data)


def recv(fd: int, on_ref, limit: int = MAX_MESSAGE) -> list:
    """One message: a list whose first item names its kind; tags decoded, references via `on_ref`."""
    size = int.from_bytes(_read_exact(fd, 8), "big")
    if size > limit:
        raise ProtocolError(f"a {size}-byte message is over the {limit}-byte limit")
    data = _read_exact(fd, size)
    try:
        msg = json.loads(data, object_hook=lambda d: _untag(d, on_ref))
    except (ValueError, TypeError, RecursionError, MemoryError) as exc:
        raise ProtocolError(f"unreadable message ({type(exc).__name__}: {str(exc)[:200]})") from None
    if type(msg) is not list or not msg or type(msg[0]) is not str:
        raise ProtocolError("a message must be a list starting with its kind")
    return msg


def tag(x: object, refs: list | None = None) -> object:
    """Plain data as JSON, tagging what JSON lacks (tuple, dict with any keys, set, bytes, complex). Anything
    else becomes a reference {"R": i} when `refs` collects them (the worker's results), else a TypeError."""
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [tag(v, refs) for v in x]
    if t is tuple:
        return {"T": [tag(v, refs) for v in x]}
    if t is dict:
        return {"D": [[tag(k, refs), tag(v, refs)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"S" if t is set else "F": [tag(v, refs) for v in x]}
    if t is bytes:
        return {"B": x.decode("latin-1")}
    if t is complex:
        return {"C": [x.real, x.imag]}
    if t is Remote:
        return {"R": x._target}
    if refs is None:
        raise TypeError(f"a {t.__name__} cannot be sent to the solution's process")
    for base in (int, float, str, list, tuple, dict, set, frozenset):  # IntEnum, OrderedDict, namedtuple...
        if isinstance(x, base):
            plain = base(x)  # type: ignore[call-overload]
            return tag(plain, refs) if type(plain) is base else _ref(x, refs)
    if t.__module__ == "numpy" and hasattr(x, "tolist"):
        plain = x.tolist()  # type: ignore[attr-defined]
        return tag(plain, refs) if type(plain).__module__ != "numpy" else _ref(x, refs)
    return _ref(x, refs)


def _ref(x: object, refs: list) -> dict:
    refs.append(x)
    return {"R": len(refs) - 1}


def _untag(d: dict, on_ref) -> object:
    """The exact builtin value a tag stands for; anything unexpected is a ProtocolError."""
    if len(d) != 1:
        raise ProtocolError("a tagged value has exactly one key")
    ((key, v),) = d.items()
    if key == "R":
        return on_ref(v)
    if key == "B" and type(v) is str:
        return v.encode("latin-1")
    if key == "C" and type(v) is list and len(v) == 2 and all(type(p) in (int, float) for p in v):
        return complex(*v)
    if type(v) is list:
        if key == "T":
            return tuple(v)
        if key == "S":
            return set(v)
        if key == "F":
            return frozenset(v)
        if key == "D" and all(type(p) is list and len(p) == 2 for p in v):
            return dict(v)
    raise ProtocolError(f"unknown tag {key!r}")


class Fatal(BaseException):
    """Ends judging at once, as `status`. Not an Exception, so no `except Exception` in a test swallows it."""

    status = "failed"


class SolutionError(Exception):
    """An exception the solution raised whose type is not a builtin one: its name and message."""


class Remote:
    """The judge's handle on a function or object in the solution's process: calling it is a request over
    the pipe; it equals nothing but itself."""

    __slots__ = ("_channel", "_target")

    def __init__(self, channel: "Channel", target: object) -> None:
        self._channel, self._target = channel, target

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._channel.call(self._target, args, kwargs)

    def __eq__(self, other: object) -> bool:  # (!= follows)
        return self is other

    def __bool__(self) -> bool:  # `assert candidate(x)` must not pass on whatever object came back
        raise TypeError("a solution object that is not plain data has no truth value in the tests")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<solution object {self._target!r}>"


class Channel:
    """The judge's end of the pipes. A worker that dies, hangs up or sends what the protocol does not
    allow fails the run (`Fatal`); its exit status is never read as a result."""

    def __init__(self, call_fd: int, reply_fd: int) -> None:
        self.call_fd, self.reply_fd, self.calls = call_fd, reply_fd, 0

    def request(self, msg: list | None) -> list:
        """Send `msg` (None: send nothing) and return the reply."""
        try:
            if msg is not None:
                send(self.call_fd, msg)
            return recv(self.reply_fd, lambda target: Remote(self, target), MAX_REPLY)
        except (EOFError, BrokenPipeError):
            raise Fatal("the solution's process ended before the tests finished (how it exits counts for "
                        "nothing)") from None
        except ProtocolError as exc:
            raise Fatal(f"the solution's process broke the protocol: {exc}") from None

    def call(self, target: object, args: tuple, kwargs: dict) -> object:
        try:
            msg = ["call", target, tag(list(args)), tag(dict(kwargs))]
        except (TypeError, RecursionError) as exc:
            err = Fatal(f"the tests pass an argument the harness cannot send: {exc}")
            err.status = "error"
            raise err from None
        self.calls += 1
        reply = self.request(msg)
        if reply[0] == "v" and len(reply) == 2:
            return reply[1]
        raise solution_exception(reply)


def solution_exception(reply: list) -> BaseException:
    """The solution's exception, for the tests to see as the same builtin type where there is one (a test
    may expect a ValueError). SystemExit, KeyboardInterrupt and other BaseExceptions are `Fatal`: ending or
    interrupting the run fails it. StopIteration is not passed on as such: it would end a test's loop
    early (`all(map(...))` over nothing is True) and look like a pass."""
    if reply[0] != "x" or len(reply) != 4 or [type(v) for v in reply[1:]] != [str, str, bool]:
        return Fatal("the solution's process broke the protocol: unexpected reply")
    name, message, base = reply[1:]
    if base:
        return Fatal(f"the solution raised {name}({message!r}): ending or interrupting the run is a failure")
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls not in (StopIteration, StopAsyncIteration):
        try:
            return cls(message)
        except Exception:
            pass
    return SolutionError(f"{name}: {message}")


# ---------------------------------------------------------------- the worker: the solution's process
class _Worker:
    def __init__(self, code: object, call_fd: int, reply_fd: int) -> None:
        self.code, self.call_fd, self.reply_fd = code, call_fd, reply_fd
        self.refs: list = []
        self.module: object = None
        self.instance: object = None

    def resolve(self, ref: object) -> object:
        if type(ref) is int and 0 <= ref < len(self.refs):
            return self.refs[ref]
        if type(ref) is str and self.module is not None:
            return vars(self.module)[ref]
        raise ProtocolError(f"no object {ref!r}")

    def serve(self) -> None:
        send(self.reply_fd, ["hello"])
        while True:
            try:
                msg = recv(self.call_fd, self.resolve)
            except EOFError:  # the judge is done
                os._exit(0)
            if msg[0] == "exit":
                os._exit(0)
            try:
                reply = getattr(self, "op_" + msg[0])(*msg[1:])
            except BaseException as exc:  # SystemExit too: reported as data; the judge decides
                reply = ["x", type(exc).__name__, str(exc)[:500], not isinstance(exc, Exception)]
            send(self.reply_fd, reply)

    def op_load(self, as_module: bool, wanted: list) -> list:
        """Run the solution as a module and say which of the `wanted` names it defines as callables (stdin
        programs are only compiled: they run afresh for each case)."""
        if not as_module:
            return ["names", []]
        import types

        self.module = module = types.ModuleType("__solution__")
        sys.modules["__solution__"] = module
        exec(self.code, vars(module))
        return ["names", [n for n in wanted if type(n) is str and callable(vars(module).get(n))]]

    def op_setup(self, source: str) -> list:
        """Run a task's test setup (trusted text) in the solution's namespace; name what it bound."""
        if self.module is None or type(source) is not str:
            raise ProtocolError("setup needs a loaded solution and source text")
        space = vars(self.module)
        before = {k: id(v) for k, v in space.items()}
        exec(compile(source, "<setup>", "exec"), space)
        return ["names", [k for k, v in space.items() if before.get(k) != id(v) and not k.startswith("__")]]

    def op_call(self, target: object, args: list, kwargs: dict) -> list:
        if type(target) is list and len(target) == 2 and target[0] == LCB:
            holder = self.module
            if isinstance(vars(self.module).get("Solution"), type):
                if self.instance is None:
                    self.instance = vars(self.module)["Solution"]()
                holder = self.instance
            fn = getattr(holder, target[1])
        else:
            fn = self.resolve(target)
        return ["v", tag(fn(*args, **kwargs), self.refs)]  # type: ignore[operator]

    def op_stdio(self, data: str) -> list:
        """Run the program as __main__ with `data` on descriptor 0 itself, so `input()`, `sys.stdin.buffer`
        and `open(0)` all read it; descriptor 1 goes to a file, read back as the program's output."""
        import io
        import types

        with open(".case-in", "wb") as f:
            f.write(data.encode("utf-8", "replace"))
        write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, path, flags in ((0, ".case-in", os.O_RDONLY), (1, ".case-out", write)):
            new = os.open(path, flags, 0o600)  # may itself be `fd`, when the last case closed it (open(0))
            if new != fd:
                os.dup2(new, fd)
                os.close(new)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8")
        sys.stdout = sys.__stdout__ = out
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        raised = None
        try:
            exec(self.code, vars(main))
        except SystemExit:
            pass  # a program may end itself: what it printed is what counts (LiveCodeBench does the same)
        except BaseException as exc:
            raised = f"{type(exc).__name__}: {str(exc)[:300]}"
        _finish(out)
        with open(".case-out", "rb") as f:
            return ["out", f.read().decode("utf-8", "replace"), raised]


def _finish(out: object) -> None:
    """What interpreter exit does before output is final: join threads, run atexit handlers, flush stdout."""
    threading = sys.modules.get("threading")
    if threading is not None:
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
    atexit = sys.modules.get("atexit")
    if atexit is not None:
        atexit._run_exitfuncs()
        atexit._clear()
    for stream in (sys.stdout, out):
        try:
            stream.flush()  # type: ignore[attr-defined]
        except BaseException:  # a replaced stdout that cannot flush loses its output, as at exit
            pass


def _worker_main(cfg: dict) -> None:
    limits(cfg)
    sys.set_int_max_str_digits(0)
    with open("program.py", encoding="utf-8") as f:
        code = compile(f.read(), "solution.py", "exec")  # the parent has checked that it parses
    install_hook(os.path.realpath(os.getcwd()), False, tuple(cfg.get("deny_read", ())))
    sys.argv = ["solution.py"]
    _Worker(code, *cfg["fds"]).serve()


def _program_main(program: str, cfg: dict) -> None:
    limits(cfg)
    with open(program, encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, program, "exec")
    except SyntaxError as exc:
        print(f"SyntaxError: {exc}", file=sys.stderr)
        sys.exit(3)
    install_hook(os.path.realpath(os.getcwd()), bool(cfg.get("allow_subprocess")))
    sys.argv = [program]
    exec(code, {"__name__": "__main__", "__file__": program, "__builtins__": builtins})


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        _worker_main(json.loads(sys.argv[2]))
    else:
        _program_main(sys.argv[1], json.loads(sys.argv[2]))
