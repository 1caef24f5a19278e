"""The routes of a worker: SageMaker hosting (/ping, /invocations, /execution-parameters)
and the TF Serving REST API (/v1/models/...), over ``http.py``; ``/metrics`` in
Prometheus' format (``prometheus.py``) counts every request by route and status.

Every error is answered as ``{"error": "..."}`` with no stack trace: ours (a
``ServingError`` carries its status), an unknown route (404) or method (405, with
``Allow``), and anything unexpected (500 with the exception's type and message only);
the worker carries on. The body limit (413) is enforced by the protocol while the body
arrives.
"""

from __future__ import annotations

import logging
import re
import time

from shipyard.serving.errors import NotFound, ServingError
from shipyard.serving.http_types import HttpRequest, HttpResponse
from shipyard.serving.prometheus import metrics
from shipyard.serving.protocol import dumps, error_body
from shipyard.serving.service import Request, Service

log = logging.getLogger("shipyard.serving")
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
TFS_PREFIX = "/v1/models/"
_TFS_PATH = re.compile(
    r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
    r"(?:(?::(?P<method>[A-Za-z]+))|(?P<meta>/metadata))?$"
)


class State:
    """What the routes share: the service once loaded, or why it failed to load."""

    def __init__(self, max_payload_mb: float, execution_parameters: dict) -> None:
        self.service: Service | None = None
        self.failure: str | None = None
        self.max_payload = int(max_payload_mb * 1024 * 1024)
        self.execution_parameters = execution_parameters
        self.active = 0  # requests inside a handler (the batcher waits only for these)


def _error(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    return HttpResponse(status, error_body(message), headers=headers or [])


def _not_allowed(allowed: str) -> HttpResponse:
    return _error(405, "Method Not Allowed", [("Allow", allowed)])


class App:
    """``await app(request)`` -> response; never raises."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._exact = {
            "/ping": ("GET", self.ping),
            "/invocations": ("POST", self.invocations),
            "/execution-parameters": ("GET", self.execution_parameters),
            "/metrics": ("GET", self.prometheus),
        }
        self.metrics = metrics()

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        self.state.active += 1
        start = time.perf_counter()
        response = None
        try:
            response = await self._route(request)
        except ServingError as exc:
            response = _error(exc.status, str(exc))
        except Exception as exc:  # a bug must not take the worker down
            log.exception("unexpected error on %s %s", request.method, request.path)
            response = _error(500, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.state.active -= 1
            self.metrics.observe(
                request.method,
                request.path,
                response.status if response is not None else 500,
                time.perf_counter() - start,
            )
        return response

    async def _route(self, request: HttpRequest) -> HttpResponse:
        method, path = request.method, request.path
        exact = self._exact.get(path)
        if exact is not None:
            allowed, handler = exact
            if method == allowed or (allowed == "GET" and method == "HEAD"):
                return await handler(request)
            return _not_allowed(allowed + (",HEAD" if allowed == "GET" else ""))
        if path.startswith(TFS_PREFIX) and len(path) > len(TFS_PREFIX):
            if method in ("GET", "HEAD"):
                return self.tfs_get(path[len(TFS_PREFIX) :])
            if method == "POST":
                return await self.tfs_post(path[len(TFS_PREFIX) :], request.body)
            return _not_allowed("GET,HEAD,POST")
        return _error(404, "Not Found")

    def service(self) -> Service:
        if self.state.service is None:
            raise ServingError(self.state.failure or "the model is still loading")
        return self.state.service

    async def ping(self, request: HttpRequest) -> HttpResponse:
        state = self.state
        if state.service is None:
            return _error(
                503 if state.failure is None else 500, state.failure or "the model is still loading"
            )
        return HttpResponse(200, b"", "text/plain")

    async def prometheus(self, request: HttpRequest) -> HttpResponse:
        status, body, content_type = self.metrics.exposition()
        return HttpResponse(status, body, content_type)

    async def execution_parameters(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, dumps(self.state.execution_parameters))

    async def invocations(self, request: HttpRequest) -> HttpResponse:
        svc = self.service()
        headers = request.headers
        reply = await svc.invocations(
            Request(
                request.body,
                headers.get("content-type", ""),
                headers.get("accept", ""),
                headers.get(CUSTOM_ATTRIBUTES, ""),
            )
        )
        return HttpResponse(reply.status, reply.body, reply.content_type)

    @staticmethod
    def _parse(tail: str) -> tuple[str, int | None, str | None, bool]:
        m = _TFS_PATH.match(tail)
        if not m:
            raise NotFound(f"Malformed request: no TF Serving route /v1/models/{tail}")
        version = int(m["version"]) if m["version"] else None
        return m["name"], version, m["method"], bool(m["meta"])

    def tfs_get(self, tail: str) -> HttpResponse:
        name, version, method, meta = self._parse(tail)
        if method:
            return _not_allowed("POST")
        svc = self.service()
        payload = svc.metadata(name, version) if meta else svc.status(name, version)
        return HttpResponse(200, dumps(payload))

    async def tfs_post(self, tail: str, body: bytes) -> HttpResponse:
        name, version, method, meta = self._parse(tail)
        if not method or meta:
            raise NotFound(
                f"Malformed request: POST /v1/models/{tail}; use :predict, :classify or :regress"
            )
        reply = await self.service().tfs(name, version, method, body)
        return HttpResponse(reply.status, reply.body, "application/json")
