"""The HTTP server: one port, every service, routed by the SigV4 scope's service name.

``ThreadingHTTPServer`` (stdlib) with HTTP/1.1 keep-alive: the request path is a few
SQLite reads and JSON, the SDK polls every few seconds, and S3 bodies stream to and from
disk, so no async framework is needed. Every handler error becomes the service's own
error shape; an unexpected exception is a 500 InternalFailure with the server staying up.

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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from shipyard.server import sigv4
from shipyard.server.errors import ApiError
from shipyard.server.http import (
    MAX_API_BODY,
    Request,
    Response,
    json_response,
    tag,
    xml_response,
)

log = logging.getLogger("shipyard.server")
REST_JSON = ("sagemaker-runtime",)
QUERY_XML = ("sts", "iam")
# CloudWatch: JSON 1.0 (by target) or Smithy RPC v2 CBOR (by path), as botocore chooses
MONITORING_TARGET = "GraniteServiceVersion20100801."
MONITORING_PATH = "/service/GraniteServiceVersion20100801/"


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
    if target.startswith(MONITORING_TARGET) or req.raw_path.startswith(MONITORING_PATH):
        return "monitoring"
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


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, services: dict[str, Any], keys: dict[str, str]):
        self.services = services
        self.keys = keys
        self.require_signature = not is_loopback(host)
        if self.require_signature and not keys:
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
        if "transfer-encoding" in headers:  # no AWS SDK sends it; its body has no length
            self._send(Response(411, b"send Content-Length, not Transfer-Encoding"), close=True)
            return
        try:
            length = int(headers.get("content-length") or 0)
            if length < 0:
                raise ValueError
        except ValueError:
            self._send(Response(400, b"bad Content-Length"), close=True)
            return
        req = Request(self.command, raw_path, raw_query, headers, self.rfile, length)  # type: ignore[arg-type]
        service = "s3"
        if raw_path == "/_shipyard/health" and self.command == "GET":
            self._send(json_response({"status": "ok"}))  # liveness only: says nothing else
            return
        try:
            scope = sigv4.scope(headers, req.query)
            if scope is None:
                if self.server.require_signature:
                    raise ApiError(
                        "MissingAuthenticationToken",
                        "this server requires SigV4-signed requests (set AWS_ACCESS_KEY_ID "
                        "and AWS_SECRET_ACCESS_KEY to the server's key)",
                        403,
                    )
                service = guess_service(req)
            else:
                service, req.region = scope.service, scope.region
                if self.server.require_signature:
                    body_hash = self._signed_body_hash(service, req)
                    sigv4.verify(
                        scope,
                        self.command,
                        raw_path,
                        raw_query,
                        headers,
                        body_hash,
                        self.server.keys,
                    )
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
            resp = self._error(service, req, err)
        except Exception as exc:  # noqa: BLE001 - any bug is a 500 and the server stays up
            log.exception("internal error on %s %s", self.command, self.path)
            resp = self._error(
                service, req, ApiError("InternalFailure", f"internal error: {exc}", 500)
            )
        # a body the handler did not read: small ones are drained so the connection
        # stays usable, a large one closes it (never read a body we refused)
        close = False
        if req._body is None and req.length > 0 and service != "s3":
            if req.length <= MAX_API_BODY:
                self.rfile.read(req.length)
            else:
                close = True
        elif req._body is None and req.length > 0 and resp.status >= 400:
            close = True
        self._send(resp, close=close)

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
        if service == "monitoring" and req.raw_path.startswith(MONITORING_PATH):
            from shipyard.server.monitoring import error_response as cbor_error

            return cbor_error(err)
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

    keys = {}
    access = os.environ.get("SHIPYARD_SERVER_ACCESS_KEY")
    secret = os.environ.get("SHIPYARD_SERVER_SECRET_KEY")
    if access and secret:
        keys[access] = secret
    server = ApiServer(host, port, {}, keys)
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
