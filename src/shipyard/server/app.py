"""The API server: one port, every service, routed by the SigV4 scope's service name.

``ApiServer.handle`` authorizes each request and hands it to its service; every handler
error becomes the service's own error shape, an unexpected exception a 500 InternalFailure
with the server staying up. Sockets, connection limits and the event loop are asgi.py's
(uvicorn, the stack the model server and the dashboard use); ``handle`` runs in a worker
thread, so the services' SQLite and disk work never blocks other connections.

Security (``guard``): every request, loopback included, must name this server as its
Host, carry no foreign Origin when it changes state, and be SigV4-signed with the server's
key (``credentials``: configured, else made once per home; ``shipyard server env`` prints
it) within five minutes of the server's clock. Off loopback the key must be configured.
A training job signs with a key of its own instead (``job_keys``, fetched from
``/_shipyard/credentials`` by ``job_creds``), and ``job_policy`` allows it only what the
job's role would: its prefixes, its logs, its metrics, until the job ends.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

from shipyard.control.home import Home
from shipyard.server import asgi, credentials, job_policy, s3_preflight
from shipyard.server.errors import ApiError
from shipyard.server.guard import MONITORING_PATH, Names, authorize, check_host, guess_service
from shipyard.server.http import (
    Request,
    Response,
    json_response,
    tag,
    xml_response,
)
from shipyard.server.job_creds import CREDENTIALS_PATH, container_credentials
from shipyard.server.job_keys import KeyTable

log = logging.getLogger("shipyard.server")
REST_JSON = ("sagemaker-runtime",)
QUERY_XML = ("sts", "iam")
# CloudWatch: JSON 1.0 (by target) or Smithy RPC v2 CBOR (by path), as botocore chooses


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


class ApiServer:
    """Every service behind one port: authorizes a request (SigV4), routes it by the
    signature's service name and answers errors in that service's shape. Called from a
    worker thread for each request (asgi.py owns sockets, limits and the event loop)."""

    def __init__(self, host: str, services: dict[str, Any], keys: Mapping[str, str]):
        self.services = services
        self.keys = keys  # the server's key and, in a KeyTable, every job's (job_keys)
        self.names = Names.from_env(host)
        if not is_loopback(host) and not credentials.configured():
            raise ValueError(
                f"binding {host} (not a loopback address) needs an access key: set "
                "SHIPYARD_SERVER_ACCESS_KEY and SHIPYARD_SERVER_SECRET_KEY"
            )

    def handle(self, req: Request) -> Response:
        headers, raw_path = req.headers, req.raw_path
        service = "s3"
        try:
            # -- request authorization --------------------------------------------------------
            runtime = self.services.get("sagemaker-runtime")
            if runtime is not None:  # an invocation's body is read with its endpoint's limit
                runtime.preread(req)
            if req.raw_path == CREDENTIALS_PATH and isinstance(self.keys, KeyTable):
                return container_credentials(req, self.keys, self.names)
            if req.method == "OPTIONS" and "s3" in self.services and guess_service(req) == "s3":
                check_host(headers, self.names, "s3")  # a CORS preflight: never signed
                return s3_preflight.answer(req)
            service = authorize(req, self.keys, self.names)
            grant = self.keys.grant(req.access_key) if isinstance(self.keys, KeyTable) else None
            if grant is not None:  # a job's own key: what its role allows, nothing else
                job_policy.check(grant, service, req, self._s3_split)
            # -- routing ----------------------------------------------------------------------
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
            return self._error(req.service or service, req, err)
        except Exception as exc:  # noqa: BLE001 - any bug is a 500 and the server stays up
            log.exception("internal error on %s %s", req.method, raw_path)
            return self._error(
                service, req, ApiError("InternalFailure", f"internal error: {exc}", 500)
            )

    def _s3_split(self, req: Request) -> tuple[str, str]:
        s3 = self.services.get("s3")
        if s3 is None:
            return "", ""
        return s3._split(req)

    def error_for(self, req: Request, status: int, code: str, message: str) -> Response:
        return self._error(req.service or "s3", req, ApiError(code, message, status))

    def _error(self, service: str, req: Request, err: ApiError) -> Response:
        if service == "monitoring" and req.raw_path.startswith(MONITORING_PATH):
            from shipyard.server.monitoring import error_response as cbor_error

            return cbor_error(err)
        if service == "s3":
            from shipyard.server.s3_api import error_response as s3_error

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

    os.umask(0o077)  # every file the server and its jobs write is the user's alone
    Home(home).ensure_private()
    access, secret = credentials.load(home)
    keys = KeyTable(os.path.join(home, "server", "job-keys"), {access: secret})
    server = ApiServer(host, {}, keys)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    values = env_mod.variables(home, host, bound)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    os.environ.update(values)
    hosts = tuple(h for h in {host, "localhost", "127.0.0.1"} if h not in ("", "0.0.0.0"))
    server.services = build(home, backend, hosts, keys, values["AWS_ENDPOINT_URL"])
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
