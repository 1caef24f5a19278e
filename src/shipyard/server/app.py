"""The API server: one port, every service, routed by the SigV4 scope's service name.

``ApiServer.handle`` authorizes each request and hands it to its service; every handler
error becomes the service's own error shape, an unexpected exception a 500 InternalFailure
with the server staying up. Sockets, connection limits and the event loop are asgi.py's
(uvicorn, the stack the model server and the dashboard use); ``handle`` runs in a worker
thread, so the services' SQLite and disk work never blocks other connections.

Security: on a loopback address (the default) any request is accepted, signed or not
(what a local emulator does). On any other address every request must be SigV4-signed
with the configured access key (``SHIPYARD_SERVER_ACCESS_KEY`` /
``SHIPYARD_SERVER_SECRET_KEY``) within five minutes of the server's clock.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from shipyard.server import asgi, sigv4
from shipyard.server.errors import ApiError
from shipyard.server.http import (
    Request,
    Response,
    json_response,
    tag,
    xml_response,
)

log = logging.getLogger("shipyard.server")
REST_JSON = ("sagemaker-runtime",)
QUERY_XML = ("sts", "iam")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def guess_service(req: Request) -> str:
    """The service of an unsigned request (loopback only): by its target or path."""
    target = req.headers.get("x-amz-target", "")
    if target.startswith("SageMaker."):
        return "sagemaker"
    if target.startswith("Logs_"):
        return "logs"
    if req.raw_path.startswith("/endpoints/") and req.raw_path.endswith("/invocations"):
        return "sagemaker-runtime"
    return "s3"


def error_response(service: str, err: ApiError) -> Response:
    if service in QUERY_XML:
        inner = (
            "<Error>"
            + tag("Type", "Sender" if err.status < 500 else "Receiver")
            + tag("Code", err.code)
            + tag("Message", err.message)
            + "</Error>"
            + tag("RequestId", "shipyard")
        )
        return xml_response("ErrorResponse", inner, err.status)
    resp = json_response({"__type": err.code, "message": err.message}, err.status)
    resp.headers["x-amzn-ErrorType"] = err.code
    if service in REST_JSON:
        resp.headers["Content-Type"] = "application/json"
    return resp


class ApiServer:
    """Every service behind one port: authorizes a request (SigV4), routes it by the
    signature's service name and answers errors in that service's shape. Called from a
    worker thread for each request (asgi.py owns sockets, limits and the event loop)."""

    def __init__(self, host: str, services: dict[str, Any], keys: dict[str, str]):
        self.services = services
        self.keys = keys
        self.require_signature = not is_loopback(host)
        if self.require_signature and not keys:
            raise ValueError(
                f"binding {host} (not a loopback address) needs an access key: set "
                "SHIPYARD_SERVER_ACCESS_KEY and SHIPYARD_SERVER_SECRET_KEY"
            )

    def handle(self, req: Request) -> Response:
        headers, raw_path, raw_query = req.headers, req.raw_path, req.raw_query
        service = "s3"
        try:
            # -- request authorization ----------------------------------------------------
            scope = sigv4.scope(headers, req.query)
            if scope is None:
                if self.require_signature:
                    raise ApiError(
                        "MissingAuthenticationToken",
                        "this server requires SigV4-signed requests (set AWS_ACCESS_KEY_ID "
                        "and AWS_SECRET_ACCESS_KEY to the server's key)",
                        403,
                    )
                service = guess_service(req)
            else:
                service, req.region = scope.service, scope.region
                if self.require_signature:
                    body_hash = self._signed_body_hash(service, req)
                    sigv4.verify(
                        scope,
                        req.method,
                        raw_path,
                        raw_query,
                        headers,
                        body_hash,
                        self.keys,
                    )
            # -- routing ------------------------------------------------------------------
            if service == "sagemaker" and "x-amz-target" not in headers:
                service = "sagemaker-runtime"  # it signs as "sagemaker" too
            req.service = service
            handler = self.services.get(service)
            if handler is None:
                raise ApiError(
                    "UnknownService",
                    f"service {service!r} is not served here; shipyard server answers "
                    + ", ".join(sorted(self.services)),
                    400,
                )
            return handler.handle(req)
        except ApiError as err:
            return self._error(service, req, err)
        except Exception as exc:  # noqa: BLE001 - any bug is a 500 and the server stays up
            log.exception("internal error on %s %s", req.method, raw_path)
            return self._error(
                service, req, ApiError("InternalFailure", f"internal error: {exc}", 500)
            )

    def error_for(self, req: Request, status: int, code: str, message: str) -> Response:
        return self._error(req.service or "s3", req, ApiError(code, message, status))

    @staticmethod
    def _signed_body_hash(service: str, req: Request) -> str:
        """The payload hash the signature covers. Other services: the body's, read now.
        S3: the x-amz-content-sha256 header, which the body must then match (small bodies
        are checked here, uploads as they stream to disk, in s3.py)."""
        if service != "s3":
            return hashlib.sha256(req.body).hexdigest()
        declared = req.headers.get("x-amz-content-sha256", sigv4.UNSIGNED)
        if declared.startswith("STREAMING-AWS4-HMAC-SHA256"):
            raise ApiError(
                "NotImplemented",
                "chunk-signed uploads (STREAMING-AWS4-HMAC-SHA256-PAYLOAD) are not "
                "accepted; sign the whole payload or send UNSIGNED-PAYLOAD",
                501,
            )
        if len(declared) == 64 and req.length <= 1 << 20:
            if hashlib.sha256(req.body).hexdigest() != declared:
                raise ApiError(
                    "XAmzContentSHA256Mismatch", "the body does not match its signed SHA-256"
                )
        return declared

    def _error(self, service: str, req: Request, err: ApiError) -> Response:
        if service == "s3":
            from shipyard.server.s3 import error_response as s3_error

            return s3_error(err, req.method == "HEAD")
        return error_response(service, err)


def serve(
    host: str,
    port: int,
    home: str,
    backend: str = "local",
    ready: threading.Event | None = None,
    on_bound: Callable[[asgi.Server], None] | None = None,
) -> None:
    """Build the services over ``home`` and serve until interrupted (SIGINT/SIGTERM).

    The server's own process environment points at itself (endpoint, keys, region), so
    the control plane's S3 calls and every job and endpoint it starts read and write
    this server's S3."""
    from shipyard.server import env as env_mod
    from shipyard.server.services import build

    keys = {}
    access = os.environ.get("SHIPYARD_SERVER_ACCESS_KEY")
    secret = os.environ.get("SHIPYARD_SERVER_SECRET_KEY")
    if access and secret:
        keys[access] = secret
    server = ApiServer(host, {}, keys)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    values = env_mod.variables(home, host, bound)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    os.environ.update(values)
    hosts = tuple(h for h in {host, "localhost", "127.0.0.1"} if h not in ("", "0.0.0.0"))
    server.services = build(home, backend, hosts)
    log.info("shipyard server listening on %s (SHIPYARD_HOME=%s)", values["AWS_ENDPOINT_URL"], home)
    http = asgi.Server(server)
    if on_bound is not None:
        on_bound(http)
    if ready is not None:
        ready.set()
    try:
        asgi.run(http, sock)
    finally:
        sock.close()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the services are built (port 0 picks one, and
    the environment the server exports names the port actually bound)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock
