"""The HTTP server: one port, every service, routed by the SigV4 scope's service name.

``ThreadingHTTPServer`` (stdlib) with HTTP/1.1 keep-alive: the request path is a few
SQLite reads and JSON, the SDK polls every few seconds, and S3 bodies stream to and from
disk, so no async framework is needed. Every handler error becomes the service's own
error shape; an unexpected exception is a 500 InternalFailure with the server staying up.

Security (``guard``): every request, loopback included, must name this server as its
Host, carry no foreign Origin when it changes state, and be SigV4-signed with the server's
key (``credentials``: configured, else made once per home; ``shipyard server env`` prints
it) within five minutes of the server's clock. Off loopback the key must be configured.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from shipyard.control.home import Home
from shipyard.server import credentials
from shipyard.server.errors import ApiError
from shipyard.server.guard import Names, authorize
from shipyard.server.http import (
    MAX_API_BODY,
    Request,
    Response,
    json_response,
    tag,
    xml_response,
)
from shipyard.server.s3 import http_chunked

log = logging.getLogger("shipyard.server")
REST_JSON = ("sagemaker-runtime",)
QUERY_XML = ("sts", "iam")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


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


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, services: dict[str, Any], keys: dict[str, str]):
        self.services = services
        self.keys = keys
        self.names = Names.from_env(host)
        if not is_loopback(host) and not credentials.configured():
            raise ValueError(
                f"binding {host} (not a loopback address) needs an access key: set "
                "SHIPYARD_SERVER_ACCESS_KEY and SHIPYARD_SERVER_SECRET_KEY"
            )
        super().__init__((host, port), Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiServer
    server_version = "shipyard"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _serve(self) -> None:
        raw_path, _, raw_query = self.path.partition("?")
        headers = {k.lower(): v for k, v in self.headers.items()}
        stream: Any = self.rfile
        try:
            length = int(headers.get("content-length") or 0)
            if length < 0:
                raise ValueError
        except ValueError:
            self._send(Response(400, b"bad Content-Length"), close=True)
            return
        if "transfer-encoding" in headers:  # a body of unknown length (-1), S3 uploads only
            if headers["transfer-encoding"].strip().lower() != "chunked":
                self._send(Response(501, b"Transfer-Encoding: chunked only"), close=True)
                return
            stream, length = http_chunked(stream), -1
        req = Request(self.command, raw_path, raw_query, headers, stream, length)
        service = "s3"
        if raw_path == "/_shipyard/health" and self.command == "GET":
            self._send(json_response({"status": "ok"}))  # liveness only: says nothing else
            return
        try:
            service = authorize(req, self.server.keys, self.server.names)
            if service == "sagemaker" and "x-amz-target" not in headers:
                service = "sagemaker-runtime"  # it signs as "sagemaker" too
            req.service = service
            handler = self.server.services.get(service)
            if handler is None:
                raise ApiError(
                    "UnknownService",
                    f"service {service!r} is not served here; shipyard server answers "
                    + ", ".join(sorted(self.server.services)),
                    400,
                )
            resp = handler.handle(req)
        except ApiError as err:
            service = req.service or service
            resp = self._error(service, req, err)
        except Exception as exc:  # noqa: BLE001 - any bug is a 500 and the server stays up
            log.exception("internal error on %s %s", self.command, self.path)
            resp = self._error(
                service, req, ApiError("InternalFailure", f"internal error: {exc}", 500)
            )
        # a body the handler did not read: small ones are drained so the connection
        # stays usable, a large one closes it (never read a body we refused)
        close = length < 0  # what is left of a chunked body is not worth reading
        if req._body is None and req.length > 0 and service != "s3":
            if req.length <= MAX_API_BODY:
                self.rfile.read(req.length)
            else:
                close = True
        elif req._body is None and req.length > 0 and resp.status >= 400:
            close = True
        self._send(resp, close=close)

    def _error(self, service: str, req: Request, err: ApiError) -> Response:
        if service == "s3":
            from shipyard.server.s3 import error_response as s3_error

            return s3_error(err, req.method == "HEAD")
        return error_response(service, err)

    def _send(self, resp: Response, close: bool = False) -> None:
        self.send_response(resp.status)
        length = resp.length if resp.file else len(resp.body)
        if self.command == "HEAD" and "Content-Length" in resp.headers:
            length = int(resp.headers["Content-Length"])  # what a GET would send
        for name, value in resp.headers.items():
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.send_header("x-amzn-RequestId", "shipyard")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command == "HEAD":
            return
        if resp.file:
            with open(resp.file, "rb") as fh:
                fh.seek(resp.offset)
                left = resp.length
                while left > 0:
                    chunk = fh.read(min(1 << 20, left))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
        else:
            self.wfile.write(resp.body)


def serve(
    host: str,
    port: int,
    home: str,
    backend: str = "local",
    ready: threading.Event | None = None,
    on_bound: Callable[[ApiServer], None] | None = None,
) -> None:
    """Build the services over ``home`` and serve until interrupted (SIGINT/SIGTERM).

    The server's own process environment points at itself (endpoint, keys, region), so
    the control plane's S3 calls and every job and endpoint it starts read and write
    this server's S3."""
    from shipyard.server import env as env_mod
    from shipyard.server.services import build

    os.umask(0o077)  # every file the server and its jobs write is the user's alone
    Home(home).ensure_private()
    access, secret = credentials.load(home)
    server = ApiServer(host, port, {}, {access: secret})
    bound = server.server_address[1]
    values = env_mod.variables(home, host, bound)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    os.environ.update(values)
    hosts = tuple(h for h in {host, "localhost", "127.0.0.1"} if h not in ("", "0.0.0.0"))
    server.services = build(home, backend, hosts)
    log.info("shipyard server listening on %s (SHIPYARD_HOME=%s)", values["AWS_ENDPOINT_URL"], home)
    if on_bound is not None:
        on_bound(server)
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
