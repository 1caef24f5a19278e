"""The HTTP face of a worker (aiohttp): SageMaker hosting routes and the TF Serving REST API.

Every error, ours or aiohttp's (404 route, 405 method), is answered as
``{"error": "..."}`` with no stack trace; an unexpected exception is a 500 with its
type and message only, and the worker carries on. A body whose Content-Length is over
the payload limit is refused with 413 before it is read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from shipyard.serving.errors import NotFound, PayloadTooLarge, ServingError
from shipyard.serving.protocol import dumps, error_body
from shipyard.serving.service import Request, Service

log = logging.getLogger("shipyard.serving")
CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
_TFS_PATH = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
                       r"(?:(?::(?P<method>[A-Za-z]+))|(?P<meta>/metadata))?$")


class State:
    """What the routes share: the service once loaded, or why it failed to load."""

    def __init__(self, max_payload_mb: float, execution_parameters: dict) -> None:
        self.service: Service | None = None
        self.failure: str | None = None
        self.max_payload = int(max_payload_mb * 1024 * 1024)
        self.execution_parameters = execution_parameters
        self.active = 0  # requests inside a handler (the batcher waits only for these)


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=error_body(message), content_type="application/json")


@web.middleware
async def errors(request: web.Request,
                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServingError as exc:
        return _error(exc.status, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason)
    except Exception as exc:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


def build_app(state: State) -> web.Application:
    @web.middleware
    async def count(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        state.active += 1
        try:
            return await handler(request)
        finally:
            state.active -= 1

    app = web.Application(middlewares=[count, errors], client_max_size=state.max_payload,
                          handler_args={"tcp_keepalive": True})

    def service() -> Service:
        if state.service is None:
            raise ServingError(state.failure or "the model is still loading")
        return state.service

    async def body(request: web.Request) -> bytes:
        if request.content_length is not None and request.content_length > state.max_payload:
            raise PayloadTooLarge(
                f"body of {request.content_length} bytes is over the payload limit of "
                f"{state.max_payload} bytes (MaxPayloadInMB)")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PayloadTooLarge(f"body is over the payload limit of {state.max_payload} "
                                  "bytes (MaxPayloadInMB)") from None

    async def ping(request: web.Request) -> web.Response:
        if state.service is None:
            return _error(503 if state.failure is None else 500,
                          state.failure or "the model is still loading")
        return web.Response(status=200)

    async def execution_parameters(request: web.Request) -> web.Response:
        return web.Response(body=dumps(state.execution_parameters),
                            content_type="application/json")

    async def invocations(request: web.Request) -> web.Response:
        svc = service()
        reply = await svc.invocations(Request(
            await body(request), request.headers.get("Content-Type", ""),
            request.headers.get("Accept", ""), request.headers.get(CUSTOM_ATTRIBUTES, "")))
        return web.Response(status=reply.status, body=reply.body,
                            headers={"Content-Type": reply.content_type})

    def parse(tail: str) -> tuple[str, int | None, str | None, bool]:
        m = _TFS_PATH.match(tail)
        if not m:
            raise NotFound(f"Malformed request: no TF Serving route /v1/models/{tail}")
        version = int(m["version"]) if m["version"] else None
        return m["name"], version, m["method"], bool(m["meta"])

    async def tfs_get(request: web.Request) -> web.Response:
        name, version, method, meta = parse(request.match_info["tail"])
        if method:
            raise web.HTTPMethodNotAllowed("GET", ["POST"])
        svc = service()
        payload = svc.metadata(name, version) if meta else svc.status(name, version)
        return web.Response(body=dumps(payload), content_type="application/json")

    async def tfs_post(request: web.Request) -> web.Response:
        name, version, method, meta = parse(request.match_info["tail"])
        if not method or meta:
            raise NotFound(f"Malformed request: POST /v1/models/{request.match_info['tail']}; "
                           "use :predict, :classify or :regress")
        reply = await service().tfs(name, version, method, await body(request))
        return web.Response(status=reply.status, body=reply.body,
                            content_type="application/json")

    app.router.add_get("/ping", ping)
    app.router.add_post("/invocations", invocations)
    app.router.add_get("/execution-parameters", execution_parameters)
    app.router.add_get("/v1/models/{tail:.+}", tfs_get)
    app.router.add_post("/v1/models/{tail:.+}", tfs_post)
    return app
