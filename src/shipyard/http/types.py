"""The request and response a serving worker's handler sees, whatever HTTP front end
parsed them: ``handler(HttpRequest) -> HttpResponse`` is the seam between HTTP
(``http/protocol.py``'s fast path) and the model server (``serving/app.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class HttpRequest:
    method: str
    path: str  # percent-decoded, without the query
    query: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes = b""

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name, default)


@dataclass
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
