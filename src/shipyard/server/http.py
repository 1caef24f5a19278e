"""Request and Response as the service modules see them (no HTTP framework below them).

A request's body is read lazily: the S3 module streams large uploads from ``stream``
straight to disk, every other service reads a bounded ``body``.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, BinaryIO
from xml.sax.saxutils import escape

from shipyard.server.errors import ApiError

MAX_API_BODY = 8 << 20  # SageMaker's largest request (an invocation) is 6 MB


@dataclass
class Request:
    method: str
    raw_path: str
    raw_query: str
    headers: dict[str, str]  # lower-case names
    stream: BinaryIO
    length: int
    service: str = ""
    region: str = "us-east-1"
    access_key: str = ""  # who signed it (set once the signature's scope is read)
    signed_sha256: str = ""  # the body's signed SHA-256 (hex), checked when it is read
    _body: bytes | None = None

    @property
    def path(self) -> str:
        return urllib.parse.unquote(self.raw_path)

    @property
    def query(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.raw_query, keep_blank_values=True)

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    @property
    def body(self) -> bytes:
        return self.read_body(MAX_API_BODY)

    def read_body(self, limit: int, code: str = "ValidationException", why: str = "") -> bytes:
        """The whole body, refused (413, nothing read) when it is over ``limit`` bytes."""
        if self._body is None:
            if self.length < 0:  # Transfer-Encoding: chunked, S3 uploads only
                raise ApiError(
                    "MissingContentLength",
                    "send Content-Length: only S3 uploads may be Transfer-Encoding: chunked",
                    411,
                )
            if self.length > limit:
                raise ApiError(
                    code,
                    f"the request body is {self.length} bytes; at most {limit} are accepted" + why,
                    413,
                )
            body = self.stream.read(self.length) if self.length else b""
            if self.signed_sha256 and hashlib.sha256(body).hexdigest() != self.signed_sha256:
                raise ApiError(
                    "XAmzContentSHA256Mismatch", "the body does not match its signed SHA-256"
                )
            self._body = body
        return self._body

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body or b"{}")
        except ValueError as exc:
            raise ApiError("SerializationException", f"the body is not JSON: {exc}") from None
        except RecursionError:
            raise ApiError(
                "SerializationException", "the body's JSON is nested too deeply to read"
            ) from None
        if not isinstance(data, dict):
            raise ApiError("SerializationException", "the body must be a JSON object")
        return data

    def form(self) -> dict[str, str]:
        """A query-protocol request's parameters (STS, IAM): form body and query string."""
        pairs = urllib.parse.parse_qsl(self.raw_query, keep_blank_values=True)
        pairs += urllib.parse.parse_qsl(self.body.decode("utf-8", "replace"))
        return dict(pairs)


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    file: str | None = None  # stream this file's [offset, offset+length) instead of body
    handle: BinaryIO | None = None  # ``file`` opened already (S3: one version's bytes)
    offset: int = 0
    length: int = 0


def json_response(data: Any, status: int = 200, content_type: str = "application/x-amz-json-1.1"):
    return Response(
        status, json.dumps(data, default=_default).encode(), {"Content-Type": content_type}
    )


def _default(value: Any) -> Any:
    import datetime as dt

    if isinstance(value, dt.datetime):
        return value.timestamp()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def xml_response(root: str, inner: str, status: int = 200, ns: str | None = None) -> Response:
    attr = f' xmlns="{ns}"' if ns else ""
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root}{attr}>{inner}</{root}>'
    return Response(status, body.encode(), {"Content-Type": "application/xml"})


def tag(name: str, value: Any) -> str:
    return f"<{name}>{escape(str(value))}</{name}>"
