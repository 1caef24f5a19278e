"""Who may call the server: its own Host names, no foreign Origin, a valid signature.

Three checks, in this order, on every request (loopback included):

- ``Host`` must name this server: a loopback name or address, the bound address, an
  address of this machine when bound to all of them, or a name configured in
  ``SHIPYARD_SERVER_HOSTNAMES`` (and, for S3's virtual-hosted style, a subdomain of one of
  those names). A page that resolves its own name to 127.0.0.1 (DNS rebinding) sends its
  own name as Host, and is refused before anything is read.
- A state-changing request (not GET/HEAD/OPTIONS) carrying a browser's ``Origin`` (or
  ``Sec-Fetch-Site: cross-site``) must come from one of those names too: a cross-site form
  POST is refused even if it somehow carried credentials. AWS SDKs send neither header.
- A SigV4 signature (header or presigned query) by the server's key: an unsigned request
  is refused with the error AWS gives (S3: ``AccessDenied``; JSON services:
  ``MissingAuthenticationToken``), a tampered one with ``SignatureDoesNotMatch``.

``authorize`` is pure over the request (no socket, no server object), so the HTTP layer
calls it in one line whatever that layer is.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shipyard import settings
from shipyard.server import s3_checks, sigv4
from shipyard.server.errors import ApiError
from shipyard.server.http import Request

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
WILDCARDS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class Names:
    """The names and addresses this server answers to (lower case, no port)."""

    names: frozenset[str]
    any_local_address: bool  # bound to 0.0.0.0/::: every address of this machine

    @classmethod
    def for_bind(cls, bind_host: str, configured: Iterable[str] = ()) -> Names:
        names = set(LOOPBACK_NAMES) | {n.strip().lower() for n in configured if n.strip()}
        wildcard = bind_host in WILDCARDS
        if wildcard:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        else:
            names.add(bind_host.lower().strip("[]"))
        return cls(frozenset(names), wildcard)

    @classmethod
    def from_env(cls, bind_host: str) -> Names:
        extra = settings.get("SHIPYARD_SERVER_HOSTNAMES") or ""
        return cls.for_bind(bind_host, extra.split(","))

    def allows(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names or any(
                host.endswith("." + n) for n in self.names if not _is_ip(n)
            )
        if addr.is_loopback or host in self.names:
            return True
        return self.any_local_address and _is_local(host)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_local(address: str) -> bool:
    """An address of this machine: one a socket can bind."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def host_name(value: str) -> str:
    """``Host``/``Origin`` authority without its port: ``[::1]:80`` -> ``::1``."""
    value = value.strip()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


def denied(service: str, code_json: str, message: str) -> ApiError:
    """A 403 in the service's shape: S3 says AccessDenied, the JSON services their code."""
    return ApiError("AccessDenied" if service == "s3" else code_json, message, 403)


def check_host(headers: Mapping[str, str], names: Names, service: str) -> None:
    host = host_name(headers.get("host", ""))
    if not host or not names.allows(host):
        raise denied(
            service,
            "AccessDeniedException",
            f"Host {headers.get('host', '')!r} is not this server's name; call it by a "
            "loopback name or its bound address, or add the name to "
            "SHIPYARD_SERVER_HOSTNAMES",
        )


def check_origin(method: str, headers: Mapping[str, str], names: Names, service: str) -> None:
    if method in SAFE_METHODS:
        return
    origin = headers.get("origin")
    cross = headers.get("sec-fetch-site", "") == "cross-site"
    if origin is None and not cross:
        return
    site = urllib.parse.urlsplit(origin or "").netloc
    if cross or not site or not names.allows(host_name(site)):
        raise denied(
            service,
            "AccessDeniedException",
            f"a {method} from the web page at {origin or 'another site'} is refused: "
            "state-changing requests come from AWS SDKs, not browsers",
        )


MONITORING_TARGET = "GraniteServiceVersion20100801."
MONITORING_PATH = "/service/GraniteServiceVersion20100801/"


def guess_service(req: Request) -> str:
    """The service of an unsigned request (for the shape of its error): target or path."""
    target = req.headers.get("x-amz-target", "")
    if target.startswith("SageMaker."):
        return "sagemaker"
    if target.startswith("Logs_"):
        return "logs"
    if target.startswith(MONITORING_TARGET) or req.raw_path.startswith(MONITORING_PATH):
        return "monitoring"  # CloudWatch metrics: JSON 1.0 or Smithy RPC v2 CBOR
    if req.raw_path.startswith("/endpoints/") and req.raw_path.endswith("/invocations"):
        return "sagemaker-runtime"
    if "Action=" in req.raw_query or req.headers.get("content-type", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        return "sts"
    return "s3"


def authorize(req: Request, keys: Mapping[str, str], names: Names) -> str:
    """The service of a request this server may answer; ApiError (403) otherwise."""
    sc = sigv4.scope(req.headers, req.query)
    service = sc.service if sc is not None else guess_service(req)
    req.service = service  # the shape of an error raised below
    check_host(req.headers, names, service)
    check_origin(req.method, req.headers, names, service)
    if sc is None:
        if service == "s3":
            s3_checks.refuse_sigv2(req.headers, req.query)
        raise denied(
            service,
            "MissingAuthenticationToken",
            "the request is not signed; shipyard server answers SigV4-signed requests only "
            '(boto3 and the SageMaker SDK sign: run eval "$(shipyard server env)" to get '
            "the server's key)",
        )
    req.region = sc.region
    req.access_key = sc.access_key
    declared = signed_body_hash(service, req)
    sigv4.verify(sc, req.method, req.raw_path, req.raw_query, req.headers, declared, keys)
    if service == "s3" and len(declared) == 64:
        # checked where the body is read (Request.read_body; uploads as they stream to
        # disk): only once the headers are authenticated and the operation wants it, so a
        # client waiting on "Expect: 100-continue" is told to send only then
        req.signed_sha256 = declared
    return service


def signed_body_hash(service: str, req: Request) -> str:
    """The payload hash the signature covers. Other services: the body's, read now.
    S3: the x-amz-content-sha256 header, which the body must then match (checked where
    it is read: ``Request.read_body``, or as an upload streams to disk in s3_api.py)."""
    if service != "s3":
        if req.length < 0:
            raise ApiError("MissingContentLength", f"{service} requests need a Content-Length", 411)
        return hashlib.sha256(req.body).hexdigest()
    declared = req.headers.get("x-amz-content-sha256", sigv4.UNSIGNED)
    if declared.startswith("STREAMING-AWS4-HMAC-SHA256"):
        raise ApiError(
            "NotImplemented",
            "chunk-signed uploads (STREAMING-AWS4-HMAC-SHA256-PAYLOAD) are not "
            "accepted; sign the whole payload or send UNSIGNED-PAYLOAD",
            501,
        )
    return declared
