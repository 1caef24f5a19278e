"""The dashboard's web app (Starlette, served by uvicorn): the JSON API of ``api.py``
and three pages (jobs, one job, endpoints) whose scripts draw everything from that API.

Assets live in this package (``static/``): no CDN, nothing downloaded at run time.
The pages put every string they show into the DOM as text (``textContent``), never as
HTML, so a job name, log line or metric name holding ``<script>`` is shown as text.
Every request passes ``guard.Guard`` first (its own ``Host`` only, no cross-site
writes), and everything that reads files, the job store or an endpoint runs in a worker
thread, so a slow read (a long log, an endpoint that does not answer) never holds up
the other pages' polls.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from shipyard.control.client import ControlPlane
from shipyard.dashboard import api, boards, usageread
from shipyard.dashboard import plan as planning
from shipyard.dashboard.guard import Guard
from shipyard.dashboard.logread import CursorError, parse_cursor
from shipyard.errors import JobNotFoundError
from shipyard.planner.profile import PlanInputError

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _json(payload: Any, status: int = 200) -> Response:
    return JSONResponse(payload, status_code=status, headers=SECURITY_HEADERS)


def _page(name: str, status: int = 200) -> Response:
    return FileResponse(os.path.join(STATIC, name), status_code=status, headers=SECURITY_HEADERS)


def _ends(tensorboards: boards.Boards) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the TensorBoards it started end with it (no orphans)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await run_in_threadpool(tensorboards.close)

    return lifespan


def create_app(home: str | None = None, bind: str = "127.0.0.1") -> Guard:
    """The app behind its guard; ``bind`` is the address it listens on (its own name)."""
    control = ControlPlane(home)
    tensorboards = boards.Boards(control, bind)

    def not_found(exc: JobNotFoundError) -> Response:
        return _json({"error": str(exc)}, 404)

    async def list_jobs(request: Request) -> Response:
        return _json(await run_in_threadpool(api.jobs, control))

    async def one_job(request: Request) -> Response:
        shown = request.query_params.get("environment", "hide")
        if shown not in ("hide", "show"):
            return _json({"error": f"environment={shown!r}: pass 'show' or 'hide'"}, 400)
        try:
            name = request.path_params["name"]
            return _json(await run_in_threadpool(api.job, control, name, shown == "show"))
        except JobNotFoundError as exc:
            return not_found(exc)

    async def job_logs(request: Request) -> Response:
        q = request.query_params
        try:
            cursor = parse_cursor(q["cursor"]) if "cursor" in q else None
        except CursorError as exc:
            return _json({"error": str(exc)}, 400)
        try:
            return _json(
                await run_in_threadpool(
                    api.logs,
                    control,
                    request.path_params["name"],
                    cursor,
                    q.get("host") or None,
                    q.get("noise") == "1",
                )
            )
        except JobNotFoundError as exc:
            return not_found(exc)

    async def job_metrics(request: Request) -> Response:
        try:
            return _json(await run_in_threadpool(api.metrics, control, request.path_params["name"]))
        except JobNotFoundError as exc:
            return not_found(exc)

    async def job_utilization(request: Request) -> Response:
        q = request.query_params
        try:
            cursor = usageread.parse_cursor(q["cursor"]) if "cursor" in q else 0
        except CursorError as exc:
            return _json({"error": str(exc)}, 400)
        try:
            name = request.path_params["name"]
            return _json(await run_in_threadpool(api.utilization, control, name, cursor))
        except JobNotFoundError as exc:
            return not_found(exc)

    async def job_plan(request: Request) -> Response:
        """The planner's rows; ``plannable: false`` with its message when the job cannot
        be planned (not finished, nothing usable measured): an answer about the job, not
        a failed request, so a page polling a running job logs no error. 400 for an
        option that does not parse."""
        try:
            query = planning.query(request.query_params)
            name = request.path_params["name"]
            return _json(await run_in_threadpool(api.plan, control, name, query))
        except JobNotFoundError as exc:
            return not_found(exc)
        except PlanInputError as exc:
            return _json({"plannable": False, "error": str(exc)})
        except ValueError as exc:  # ValidationError and what a number's parse raises
            return _json({"error": str(exc)}, 400)

    async def list_endpoints(request: Request) -> Response:
        return _json(await run_in_threadpool(api.endpoints, control.home.root))

    async def index(request: Request) -> Response:
        return _page("index.html")

    def known(joined: str) -> bool:
        try:
            for name in joined.split(","):
                control.get(name)
        except JobNotFoundError:
            return False
        return True

    async def job_page(request: Request) -> Response:
        """A job's page (or several, comma-separated, compared); 404 and a page that
        says so when a name is no job (the page alone would poll an API that 404s)."""
        joined = ",".join(n for n in request.path_params["name"].split(",") if n)
        found: bool = bool(joined) and await run_in_threadpool(known, joined)
        if found:
            return _page("job.html")
        return _page("notfound.html", 404)

    async def download_logs(request: Request) -> Response:
        """The whole log as a file (``shipyard logs``' text, or ``--json``'s lines)."""
        q = request.query_params
        fmt = q.get("format", "text")
        if fmt not in ("text", "json") or q.get("timestamps", "1") not in ("0", "1"):
            return _json({"error": "pass format=text or format=json, and timestamps=1 or 0"}, 400)
        name = request.path_params["name"]
        try:
            filename, text = await run_in_threadpool(
                api.log_download,
                control,
                name,
                q.get("host") or None,
                q.get("noise") == "1",
                q.get("timestamps", "1") == "1",
                fmt == "json",
            )
        except JobNotFoundError as exc:
            return not_found(exc)
        except api.BadLogRequestError as exc:
            return _json({"error": str(exc)}, 400)
        headers = dict(SECURITY_HEADERS)
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
        return PlainTextResponse(text, headers=headers)

    async def stop_job(request: Request) -> Response:
        try:
            return _json(await run_in_threadpool(api.stop, control, request.path_params["name"]))
        except JobNotFoundError as exc:
            return not_found(exc)
        except api.JobEndedError as exc:
            return _json({"error": str(exc)}, 409)

    async def job_tensorboard(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            board = await run_in_threadpool(tensorboards.open, name)
        except JobNotFoundError as exc:
            return not_found(exc)
        except boards.TensorBoardUnavailableError as exc:
            return _json({"error": str(exc)}, 409)
        return _json({"job": name, "port": board.port, "logdir": board.logdir})

    async def endpoints_page(request: Request) -> Response:
        return _page("endpoints.html")

    async def favicon(request: Request) -> Response:
        return _page("favicon.svg")

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/jobs/{name}", job_page),
            Route("/endpoints", endpoints_page),
            Route("/favicon.ico", favicon),
            Route("/api/jobs", list_jobs),
            Route("/api/jobs/{name}", one_job),
            Route("/api/jobs/{name}/logs", job_logs),
            Route("/api/jobs/{name}/logs/download", download_logs),
            Route("/api/jobs/{name}/metrics", job_metrics),
            Route("/api/jobs/{name}/utilization", job_utilization),
            Route("/api/jobs/{name}/plan", job_plan),
            Route("/api/jobs/{name}/stop", stop_job, methods=["POST"]),
            Route("/api/jobs/{name}/tensorboard", job_tensorboard, methods=["POST"]),
            Route("/api/endpoints", list_endpoints),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=_ends(tensorboards),
    )
    return Guard(app, bind)


def serve(host: str, port: int, home: str | None = None) -> None:
    """Run until Ctrl-C (uvicorn's own signal handling), on the HTTP layer every shipyard
    server uses (``shipyard.http``), with a local dashboard's limits."""
    from shipyard.http import adapter
    from shipyard.http.limits import Limits

    limits = Limits(
        head_timeout=30.0,  # a request head in 30 s from its first byte (408)
        max_head=64 << 10,  # 431 beyond
        read_timeout=60.0,  # a POST body with no byte this long: closed
        body_timeout=None,
        keepalive_timeout=5.0,  # uvicorn's own default, as before
        max_connections=256,  # a few browser tabs' worth, with their live-log streams
        max_body=None,  # the routes read no large body
    )
    server = adapter.uvicorn_server(
        create_app(home, host), limits, name="shipyard ui", lifespan="on", host=host, port=port
    )
    adapter.run(adapter.serve(server))
