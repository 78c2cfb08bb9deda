"""The `rllm view` web server: the JSON API (rllm_monitor.api) and the page (rllm_monitor/static/).

`make_app(root, token)` builds the aiohttp application (tests drive it in-process); `start_view_server`
runs it on a background thread with its own event loop and returns once the port is bound, like the policy
server (rllm_serve/server.py), so the CLI, tests and benchmarks share one code path.

Safety: runs hold prompts and completions, so the server listens on loopback unless told otherwise, and any
other host needs a token. With a token every /api request must carry it (``Authorization: Bearer T``,
``?token=T``, or the cookie that ``/?token=T`` sets for the page).
"""

from __future__ import annotations

import errno
import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from rllm_core.errors import ConfigError
from rllm_core.runs.reader import RunReader, RunReadError, find_runs
from rllm_core.threaded_app import ThreadedApp
from rllm_monitor.api import ApiError, ViewState, add_routes

__all__ = ["LOCAL_HOSTS", "STATE", "STATIC_DIR", "ViewServer", "check_root", "make_app", "start_view_server"]

log = logging.getLogger("rllm.monitor")

STATIC_DIR = Path(__file__).parent / "static"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
"""Hosts the server may listen on without a token: only this machine can connect."""
COOKIE = "rllm_view_token"
STATE = web.AppKey("state", ViewState)
"""The app's ViewState (what it caches about the runs), for tests and embedders."""

_PLACEHOLDER = """<!doctype html><meta charset="utf-8"><title>rllm view</title>
<p>The rllm view page is not installed (rllm_monitor/static/index.html is missing). The JSON API works:
<a href="/api/runs">/api/runs</a>.</p>"""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _token_of(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.query.get("token") or request.cookies.get(COOKIE)


def make_app(root: Path, token: str | None = None) -> web.Application:
    """The view application for the runs under `root` (a run folder or a folder of runs)."""
    state = ViewState(Path(root))
    token = token or None

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        api = request.path.startswith("/api/")
        if token is None and api and request.url.host not in LOCAL_HOSTS:
            # no token means loopback only: a web page that rebinds its own domain to 127.0.0.1 (DNS rebinding)
            # would otherwise read the runs (prompts, answers) through the browser
            return _json_error(403, f"Host {request.host!r} is not a loopback name; this server was started "
                                    "without --token, so only http://127.0.0.1 / localhost may ask it")
        if token is not None and api:
            given = _token_of(request)
            if given is None or not hmac.compare_digest(given.encode(), token.encode()):
                why = "wrong token" if given is not None else "no token"
                return _json_error(401, f"{why}: this server was started with --token; send "
                                        "'Authorization: Bearer <token>' or add ?token=<token>")
        try:
            return await handler(request)
        except ApiError as exc:
            return _json_error(exc.status, exc.message)
        except RunReadError as exc:  # no such episodes file or index: the reader's message says what there is
            return _json_error(404, str(exc))
        except web.HTTPException:
            raise
        except Exception as exc:
            if not api:
                raise
            log.exception("rllm view: %s failed", request.path_qs)
            return _json_error(500, f"{type(exc).__name__}: {exc}")

    async def index(request: web.Request) -> web.StreamResponse:
        page = STATIC_DIR / "index.html"
        response: web.StreamResponse
        if page.is_file():
            response = web.FileResponse(page, headers={"Cache-Control": "no-cache"})
        else:
            response = web.Response(text=_PLACEHOLDER, content_type="text/html")
        given = request.query.get("token")
        if token is not None and given is not None:
            if not hmac.compare_digest(given.encode(), token.encode()):
                return web.Response(status=401, text="wrong token for this rllm view server")
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        return response

    async def static(request: web.Request) -> web.StreamResponse:
        base = STATIC_DIR.resolve()
        path = (base / request.match_info["path"]).resolve()
        if base not in path.parents or not path.is_file():
            raise web.HTTPNotFound(text=f"no static file {request.match_info['path']!r}")
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    app = web.Application(middlewares=[guard])
    add_routes(app, state)
    app.router.add_get("/", index)
    app.router.add_get("/static/{path:.+}", static)
    app[STATE] = state
    return app


def check_root(root: Path) -> None:
    """ConfigError unless `root` is a run directory or has one below it (saying what a run looks like)."""
    from rllm_core.runs.reader import WHAT_A_RUN_IS

    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a folder: give a run directory (the --output of `rllm train` or "
                          "`rllm eval`) or a folder that holds runs")
    if RunReader(root).is_run() or find_runs(root):
        return
    raise ConfigError(f"{root} is not a run and holds no run below it: {WHAT_A_RUN_IS} (see "
                      "docs/run-directory.md)")


def check_host(host: str, token: str | None) -> None:
    if host not in LOCAL_HOSTS and not token:
        raise ConfigError(f"--host {host} lets other machines read these runs (prompts and completions included); "
                          "add --token <secret> so only those who know it can, or keep the default "
                          "--host 127.0.0.1")


class ViewServer:
    """The view server running on a background thread; a context manager that stops it on exit."""

    def __init__(self, root: Path, host: str, token: str | None) -> None:
        self.root = Path(root)
        self.host = host
        self.token = token or None
        self._http: ThreadedApp | None = None

    @property
    def url(self) -> str:
        """Base URL, no trailing slash: ``http://127.0.0.1:8420``."""
        return self._http.url if self._http else ""

    @property
    def port(self) -> int:
        return self._http.port if self._http else 0

    @property
    def page_url(self) -> str:
        """The URL to open in a browser (with the token, which the page then keeps in a cookie)."""
        return f"{self.url}/?token={self.token}" if self.token else f"{self.url}/"

    def start(self, port: int, timeout: float = 30) -> ViewServer:
        self._http = ThreadedApp(lambda: make_app(self.root, self.token), self.host, port, name="rllm-view-http",
                                 shutdown_timeout=2)
        try:
            self._http.start(timeout)
        except TimeoutError:
            raise ConfigError(f"rllm view did not start listening on {self.host}:{port} within {timeout:.0f} s") \
                from None
        except BaseException as exc:
            raise _listen_error(exc, self.host, port) from None
        return self

    def stop(self) -> None:
        """Stop serving and join the thread. Idempotent."""
        if self._http is not None:
            self._http.stop(timeout=10)

    def __enter__(self) -> ViewServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ViewServer(root={str(self.root)!r}, url={self.url!r})"


def _listen_error(exc: BaseException, host: str, port: int) -> ConfigError:
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return ConfigError(f"port {port} on {host} is already in use (another `rllm view`?); choose another "
                           "with --port N, or --port 0 for any free port")
    if isinstance(exc, OSError) and exc.errno == errno.EACCES:
        return ConfigError(f"not allowed to listen on {host}:{port} (ports below 1024 need privileges); "
                           "choose --port 1024 or above, or --port 0 for any free port")
    return ConfigError(f"rllm view cannot listen on {host}:{port}: {exc}; check --host, or choose another --port "
                       "(0 picks a free one)")


def start_view_server(root: Path | str, host: str = "127.0.0.1", port: int = 0,
                      token: str | None = None) -> ViewServer:
    """Check the inputs, serve the runs under `root` on host:port (0: a free port), return once listening.

    ConfigError when `root` holds no run, when a non-local host has no token, or when the port is taken."""
    root = Path(root).expanduser()
    check_host(host, token)
    check_root(root)
    return ViewServer(root, host, token).start(port)
