"""``makespan dashboard``: a small read-only web app showing the fleet live.

A Starlette application (served by uvicorn) with these routes, all under the optional
``url_prefix`` (for a reverse proxy that forwards ``/PREFIX/...`` unchanged, as
Flower's ``--url-prefix``):

=====================  ===============================================================
``GET /``              the page (``static/index.html``)
``GET /job/{id}``      the job page (``static/job.html``)
``GET /api/state``     :func:`makespan.dashboard.state.snapshot` as JSON
``GET /api/job/{id}``  :func:`makespan.dashboard.state.job_detail` as JSON (404 if none)
``GET /api/stream``    server-sent events: one ``state`` event (the snapshot) every
                       ``refresh_s`` seconds
``GET /static/...``    the page's script and style, shipped in the package
=====================  ===============================================================

Nothing is written to Redis and only GET (and HEAD) is routed. With ``basic_auth``
(``"user:password"``, several separated by commas, like Flower's ``--basic-auth``)
every route answers 401 without matching credentials.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from makespan.errors import ValidationError
from makespan.keys import Keys
from makespan.models import FleetSpec

STATIC_DIR = Path(__file__).parent / "static"


@dataclass(frozen=True)
class DashboardConfig:
    """What one dashboard serves.

    Attributes:
        redis_url: the deployment's Redis.
        key_prefix: its key prefix (``MAKESPAN_KEY_PREFIX``).
        window_s: seconds of history in the Gantt (default 10 minutes).
        refresh_s: seconds between two server-sent snapshots.
        basic_auth: ``"user:password[,user2:password2]"`` or empty for none.
        url_prefix: path prefix, e.g. ``"makespan"`` serves ``/makespan/``.
        fleet: the fleet spec; default: the one the planner stored at ``P:fleet``.
        stale_after_s: a planner's wait reason older than this while no planner leads
            reads ``no_planner`` (``makespan why`` uses half the lease TTL).
    """

    redis_url: str
    key_prefix: str = "makespan"
    window_s: float = 600.0
    refresh_s: float = 1.0
    basic_auth: str = ""
    url_prefix: str = ""
    fleet: FleetSpec | None = None
    stale_after_s: float = 1.5

    def credentials(self) -> list[tuple[str, str]]:
        """(user, password) pairs of ``basic_auth``.

        Raises:
            ValidationError: an entry is not ``user:password`` with both parts non-empty.
        """
        out = []
        for item in filter(None, (x.strip() for x in self.basic_auth.split(","))):
            user, sep, password = item.partition(":")
            if not sep or not user or not password:  # the entry may be a password: not shown
                raise ValidationError("--basic-auth", None, f"entry {len(out) + 1} must be user:password (several "
                                      "separated by commas)", show_value=False)
            out.append((user, password))
        return out

    def prefix_path(self) -> str:
        """``url_prefix`` as a mount path: ``""`` or ``"/a/b"``.

        Raises:
            ValidationError: the prefix holds characters other than letters, digits, ``-_./``.
        """
        p = self.url_prefix.strip("/")
        if not p:
            return ""
        if not all(c.isalnum() or c in "-_./" for c in p) or ".." in p:
            raise ValidationError("--url-prefix", self.url_prefix, "must be a path of letters, digits, - _ . /")
        return "/" + p


def _check_numbers(cfg: DashboardConfig) -> None:
    if not cfg.window_s > 0:
        raise ValidationError("--window-min", cfg.window_s / 60, "must be a positive number of minutes")
    if not cfg.refresh_s > 0:
        raise ValidationError("--refresh-s", cfg.refresh_s, "must be a positive number of seconds")


class BasicAuthMiddleware:
    """ASGI middleware: HTTP basic auth against a list of (user, password) pairs."""

    def __init__(self, app: Any, credentials: list[tuple[str, str]], realm: str = "makespan dashboard"):
        self.app, self.realm = app, realm
        self.allowed = [f"{u}:{p}".encode() for u, p in credentials]

    def _ok(self, header: bytes | None) -> bool:
        if not header or not header.lower().startswith(b"basic "):
            return False
        try:
            given = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return any(secrets.compare_digest(given, a) for a in self.allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers") or []).get(b"authorization")
        if self._ok(header):
            return await self.app(scope, receive, send)
        from starlette.responses import PlainTextResponse

        resp = PlainTextResponse("authentication required", status_code=401,
                                 headers={"WWW-Authenticate": f'Basic realm="{self.realm}"'})
        await resp(scope, receive, send)


async def _pause(seconds: float, stopping: threading.Event | None) -> None:
    """``asyncio.sleep(seconds)``, ended within 0.1 s once ``stopping`` is set."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while not (stopping is not None and stopping.is_set()) and (left := until - loop.time()) > 0:
        await asyncio.sleep(min(0.1, left))


def create_app(cfg: DashboardConfig, client: Any = None, stopping: threading.Event | None = None) -> Any:
    """The Starlette application of ``cfg`` (``client``: a decoded redis-py client;
    default one connected to ``cfg.redis_url``). Once ``stopping`` is set (the server's
    SIGTERM), each open event stream ends within a refresh instead of being cancelled
    when the graceful-shutdown timeout runs out.

    Raises:
        ValidationError: bad ``basic_auth``, ``url_prefix``, ``window_s`` or ``refresh_s``.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import FileResponse, JSONResponse, RedirectResponse, StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from makespan.dashboard.state import job_detail, snapshot
    from makespan.errors import StoreError

    _check_numbers(cfg)
    creds = cfg.credentials()
    prefix = cfg.prefix_path()
    if client is None:
        from makespan.redis_conn import connect

        client = connect(cfg.redis_url, socket_timeout=5.0)
    keys = Keys(cfg.key_prefix)

    cache: dict[str, Any] = {"at": 0.0, "state": None}
    cache_lock = threading.Lock()

    def read_state() -> dict[str, Any]:
        """One snapshot per half refresh at most, shared by every open page."""
        with cache_lock:
            if cache["state"] is None or time.monotonic() - cache["at"] >= cfg.refresh_s / 2:
                cache["state"] = snapshot(client, keys, cfg.fleet, cfg.window_s,
                                          stale_after_s=cfg.stale_after_s)
                cache["at"] = time.monotonic()
            return cache["state"]

    async def index(request):
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def job_page(request):
        return FileResponse(STATIC_DIR / "job.html", headers={"Cache-Control": "no-store"})

    async def api_state(request):
        try:
            return JSONResponse(await run_in_threadpool(read_state))
        except StoreError as e:
            return JSONResponse({"error": str(e)}, status_code=503)

    async def api_job(request):
        job_id = request.path_params["job_id"]
        try:
            doc = await run_in_threadpool(job_detail, client, keys, job_id, cfg.stale_after_s)
        except StoreError as e:
            return JSONResponse({"error": str(e)}, status_code=503)
        if doc is None:
            return JSONResponse({"error": f"no job {job_id!r}"}, status_code=404)
        return JSONResponse(doc)

    async def stream(request):
        async def events():
            yield f"retry: {int(cfg.refresh_s * 1000)}\n\n"
            while not (stopping is not None and stopping.is_set()) and not await request.is_disconnected():
                try:
                    body = json.dumps(await run_in_threadpool(read_state), separators=(",", ":"))
                    yield f"event: state\ndata: {body}\n\n"
                except StoreError as e:
                    yield f"event: failure\ndata: {json.dumps({'error': str(e)})}\n\n"
                await _pause(cfg.refresh_s, stopping)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/job/{job_id}", job_page, methods=["GET"]),
        Route("/api/state", api_state, methods=["GET"]),
        Route("/api/job/{job_id}", api_job, methods=["GET"]),
        Route("/api/stream", stream, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    if prefix:
        async def to_prefix(request):
            query = request.url.query  # ?updates=N and the like go with the redirect
            return RedirectResponse(prefix + "/" + (f"?{query}" if query else ""))

        routes = [Mount(prefix, routes=routes), Route(prefix, to_prefix), Route("/", to_prefix)]
    app = Starlette(routes=routes)
    app.state.client = client
    if creds:
        return BasicAuthMiddleware(app, creds)
    return app


def serve(cfg: DashboardConfig, host: str = "127.0.0.1", port: int = 9180,
          announce: Callable[[str], None] | None = None, shutdown_grace_s: float = 20.0) -> None:
    """Run the dashboard with uvicorn until interrupted; ``announce`` gets its URL first.
    On SIGTERM/SIGINT it ends within ``shutdown_grace_s`` (+ 1 s): open streams get half of
    it to close (uvicorn's ``timeout_graceful_shutdown``), then :mod:`makespan.shutdown`'s
    watchdog ends the process.

    Raises:
        ValidationError: ``port`` outside 1..65535, or a bad ``cfg`` (:func:`create_app`).
    """
    import uvicorn

    from makespan import shutdown

    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValidationError("--port", port, "must be a TCP port 1..65535")
    stopping = threading.Event()
    asgi = create_app(cfg, stopping=stopping)

    class _BoundedServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # uvicorn's own SIGTERM/SIGINT handler
            try:
                signal_name = signal.Signals(sig).name
            except ValueError:
                signal_name = f"signal {sig}"
            shutdown.arm(shutdown_grace_s, "dashboard", signal_name)
            stopping.set()  # open event streams end at their next refresh
            super().handle_exit(sig, frame)

    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=max(shutdown_grace_s / 2, 0.1))
    if announce is not None:
        announce(f"http://{host}:{port}{cfg.prefix_path()}/")
    _BoundedServer(config).run()
